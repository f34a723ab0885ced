"""Mixed-adapter batches against one adapter at a time, on one model in this process:

    python bench/llm_adapters.py [--model DIR] [--quick] [--adapters 8] [--zipf 1.0]
                                 [--streams 8,32] [--rounds 5] [--max-tokens 64]
                                 [--max-num-seqs 32 --max-batch-tokens 512 --kv-cache-mb 256]
                                 [--json -|PATH]

Two LLM replicas as thaw's LLM functions run them (``worker.llm.serve.LLMReplica``) on
the same model and the same LoRA adapters, side by side in this process:

    mixed             ``mixed_adapters = true`` (the default): calls of every adapter in
                      one batch, each token through its own call's adapter
                      (``worker.llm.adapters``)
    one at a time     ``mixed_adapters = false``: the batch runs one adapter's calls;
                      a call for another waits until they end (``AdapterGate``)

``--adapters`` LoRA adapters (r 8, PEFT's default target modules for the architecture,
B drawn at random: a trained adapter's cost, not its answers) are made once under
``--data-dir``. At each level, ``streams`` requests at once, a thread each, request
``i`` of a round through an adapter drawn from a Zipf mix (rank k taken with weight
1 / k ** ``--zipf``; the same draws for both), prompt ``i % len(PROMPTS)``, seed ``i``,
temperature 1, ``--max-tokens`` tokens. The two replicas take turns round by round, so
the machine's drift hits both alike; every figure is the median over rounds. TTFT is
to the first text, as a client sees it. Before the levels, one greedy request per
adapter through each: all at once through the mixed one, one by one through the
other; the table says how many answered the same.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console

from bench import _llm_baselines as base
from bench._common import Column, TableSpec, machine_description, render_table, write_json
from bench.llm import level_row, model_dir_of, sizes_of

MIXED = "mixed"
ONE_AT_A_TIME = "one at a time"
MODES = (MIXED, ONE_AT_A_TIME)
GREEDY_TOKENS = 24


def build_adapters(model_dir: Path, out: Path, count: int, r: int = 8) -> list[Path]:
    """``count`` LoRA adapters of the model in ``model_dir`` under ``out`` (made once):
    PEFT's default target modules for its architecture, B drawn at random."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    dirs = [out / f"adapter-{i}" for i in range(count)]
    if all((d / "adapter_config.json").is_file() for d in dirs):
        return dirs
    for i, directory in enumerate(dirs):
        torch.manual_seed(i)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        peft_model = get_peft_model(model, LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.0))
        with torch.no_grad():
            for name, param in peft_model.named_parameters():
                if "lora_B" in name:
                    param.normal_(0, 0.1)
        peft_model.save_pretrained(str(directory))
    return dirs


def zipf_mix(names: list[str], n: int, s: float, seed: int) -> list[str]:
    """``n`` draws of ``names``, rank k with weight 1 / k ** s."""
    weights = [1 / (k + 1) ** s for k in range(len(names))]
    return random.Random(seed).choices(names, weights=weights, k=n)


@contextmanager
def replica(
    model_dir: Path,
    adapter_dirs: list[Path],
    sizes: dict[str, int],
    mixed: bool,
    prefix_caching: bool = True,
) -> Iterator[Any]:
    """An LLM replica on ``model_dir`` with the adapters, as a worker would start it."""
    from safetensors.torch import load_file

    from control_plane.protocol import LLMOptions
    from snapshotter.loader import LoadedTensors
    from worker.llm.serve import LLMReplica
    from worker.sdk import Adapter, Context

    def tensors(directory: Path) -> LoadedTensors:
        loaded = LoadedTensors()
        for shard in sorted(directory.glob("*.safetensors")):
            loaded.update(load_file(shard))
        loaded.report = None  # type: ignore[assignment]  # read from files, not a store
        return loaded

    adapters = {
        d.name: Adapter(d.name, tensors(d), json.loads((d / "adapter_config.json").read_text()))
        for d in adapter_dirs
    }
    ctx = Context(
        device="cpu",
        weights=tensors(model_dir),
        config=json.loads((model_dir / "config.json").read_text()),
        files=model_dir,
        adapters=adapters,
    )
    options = LLMOptions(
        max_num_seqs=sizes["max_num_seqs"],
        max_batch_tokens=sizes["max_batch_tokens"],
        kv_cache_mb=sizes["kv_cache_mb"],
        mixed_adapters=mixed,
        prefix_caching=prefix_caching,
    )
    llm = LLMReplica(ctx, options, adapters=list(adapters.values()))
    try:
        assert (llm.routing is not None) == mixed, "the adapters could not be mixed"
        yield llm
    finally:
        llm.close()


def one(llm: Any, ids: list[int], adapter: str, sampling: Any, t0: float) -> base.StreamTiming:
    sent = time.perf_counter() - t0
    first, tokens = None, 0
    for delta in llm.stream(ids, sampling, None, adapter):
        if first is None and delta.text:
            first = time.perf_counter() - t0
        tokens += delta.tokens
    return base.StreamTiming(sent, first, time.perf_counter() - t0, tokens)


def level(llm: Any, ids: list[list[int]], mix: list[str], max_tokens: int) -> base.Level:
    """The mix's requests at once, a thread each: request ``i`` is prompt
    ``i % len(ids)`` through adapter ``mix[i]``."""
    return at_once(llm, [(ids[i % len(ids)], name) for i, name in enumerate(mix)], max_tokens)


def at_once(llm: Any, requests: list[tuple[list[int], str]], max_tokens: int) -> base.Level:
    """Each (prompt, adapter) of ``requests`` at once, a thread each, seed ``i``,
    temperature 1."""
    from worker.llm.engine import Sampling

    out: list[base.StreamTiming | None] = [None] * len(requests)
    t0 = time.perf_counter()

    def run(i: int) -> None:
        sampling = Sampling(max_new_tokens=max_tokens, temperature=1.0, seed=i)
        out[i] = one(llm, *requests[i], sampling, t0)

    base.in_threads(len(requests), run)
    return [t for t in out if t is not None]


def greedy(llm: Any, ids: list[int], names: list[str], together: bool) -> dict[str, str]:
    """Each adapter's greedy text of ``ids``: all at once, or one after another."""
    from worker.llm.engine import Sampling

    def text(name: str) -> str:
        deltas = llm.stream(ids, Sampling(max_new_tokens=GREEDY_TOKENS), None, name)
        return "".join(d.text for d in deltas)

    if not together:
        return {name: text(name) for name in names}
    got: dict[str, str] = {}
    threads = [threading.Thread(target=lambda n=n: got.update({n: text(n)})) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got


def run(args: argparse.Namespace) -> dict[str, Any]:
    model_dir, sizes = model_dir_of(args), sizes_of(args)
    out = args.data_dir / f"adapters-{model_dir.parent.name}-{model_dir.name}-{args.adapters}"
    adapter_dirs = build_adapters(model_dir, out, args.adapters)
    with (
        replica(model_dir, adapter_dirs, sizes, True) as mixed,
        replica(model_dir, adapter_dirs, sizes, False) as gated,
    ):
        figures = measure({MIXED: mixed, ONE_AT_A_TIME: gated}, args)
        figures["mixed_steps"] = mixed.routing.mixed_steps
    return {
        "model": str(model_dir),
        "adapters": args.adapters,
        "zipf": args.zipf,
        "max_tokens": args.max_tokens,
        "sizes": sizes,
        **figures,
    }


def measure(replicas: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The greedy agreement, then each level's rounds, the modes taking turns."""
    mixed, gated = replicas[MIXED], replicas[ONE_AT_A_TIME]
    names = list(mixed.adapters)
    ids = [mixed.text_prompt(p) for p in base.PROMPTS]
    together = greedy(mixed, ids[0], names, together=True)
    alone = greedy(gated, ids[0], names, together=False)
    for llm in replicas.values():
        level(llm, ids, names[:2], 4)  # warm-up
    rows = []
    for streams in args.streams:
        rounds: dict[str, list[base.Level]] = {m: [] for m in MODES}
        mixes = [
            zipf_mix(names, streams, args.zipf, 1000 * streams + n) for n in range(args.rounds)
        ]
        for n, mix in enumerate(mixes):
            for mode in MODES if n % 2 == 0 else MODES[::-1]:
                rounds[mode].append(level(replicas[mode], ids, mix, args.max_tokens))
        adapters_a_level = statistics.median(len(set(m)) for m in mixes)
        for mode in MODES:
            row = level_row(streams, rounds[mode], math.inf, math.inf)
            rows.append({"mode": mode, "adapters_a_level": adapters_a_level, **row})
        print(f"{streams} streams: done", file=sys.stderr, flush=True)
    return {
        "greedy_same": sum(together[n] == alone[n] for n in names),
        "greedy_distinct": len(set(alone.values())),
        "rows": rows,
    }


def table(result: dict[str, Any]) -> TableSpec:
    gated = {r["streams"]: r for r in result["rows"] if r["mode"] == ONE_AT_A_TIME}
    heads = [
        "mode",
        "streams",
        "adapters a level",
        "tokens/s",
        "x one at a time",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "TPOT p50 ms",
    ]
    body = []
    for r in result["rows"]:
        other = gated[r["streams"]]
        ratio = r["tokens_per_s"] / other["tokens_per_s"]
        body.append(
            [
                r["mode"],
                str(r["streams"]),
                f"{r['adapters_a_level']:g}",
                f"{r['tokens_per_s']:.1f}",
                f"{ratio:.2f}",
                f"{r['ttft_p50_ms']:.1f}",
                f"{r['ttft_p99_ms']:.1f}",
                f"{r['tpot_p50_ms']:.2f}",
            ]
        )
    n, model = result["adapters"], Path(result["model"])
    title = (
        f"{model.parent.name}/{model.name}: {n} adapters, Zipf s={result['zipf']:g},"
        f" {result['max_tokens']} tokens a stream, medians over rounds; greedy answers"
        f" mixed = one at a time: {result['greedy_same']} of {n}"
        f" ({result['greedy_distinct']} distinct)"
    )
    return TableSpec(title, [Column(h) for h in heads], body)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", help="a model directory (default: the bench's example model)")
    p.add_argument("--quick", action="store_true", help="the tiny example model")
    p.add_argument("--adapters", type=int, default=8)
    p.add_argument("--zipf", type=float, default=1.0, help="the mix's exponent s")
    p.add_argument("--streams", default="8,32")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--max-batch-tokens", type=int, default=512)
    p.add_argument("--kv-cache-mb", type=int, default=256)
    p.add_argument("--data-dir", type=Path, default=Path(__file__).resolve().parent / ".data")
    p.add_argument("--json", dest="json_out", help="also write the figures as JSON (- for stdout)")
    args = p.parse_args(argv)
    args.streams = [int(s) for s in args.streams.split(",")]
    if args.rounds < 1 or args.adapters < 2:
        p.error("--rounds must be at least 1 and --adapters at least 2")
    result = run(args)
    render_table(table(result), Console(width=None if sys.stdout.isatty() else 200))
    if args.json_out:
        write_json({"machine": machine_description(), **result}, args.json_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
