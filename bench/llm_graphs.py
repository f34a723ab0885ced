"""The LLM engine's CUDA graph settings, side by side on one model in this process:

    python bench/llm_graphs.py [--model DIR] [--quick] [--streams 8,32] [--rounds 5]
                               [--settings eager,eager-dense,transformers,thaw,thaw-first,
                                           thaw-ahead,thaw-masks]
                               [--spread-ms 0] [--device cuda] [--json -|PATH]

Each setting is the engine thaw's LLM functions run (``worker.llm.engine.Engine``, its
sizes as bench/llm.py's), started afresh on the model:

    eager         ``cuda_graphs`` off: every step launches its kernels one by one,
                  each under a mask of its own size (``worker.llm.attention``)
    eager-dense   eager, with transformers' dense attention mask as wide as the cache
                  (``step_masks`` off)
    transformers  graphs at transformers' own padding (queries to 64 tokens, keys and
                  values to 16,384), each shape captured the first time it comes: what
                  ``use_cuda_graph=True`` alone gives
    thaw          thaw's setting (the default): graphs, queries padded to 16 tokens,
                  keys to 256 or 1/32 of the cache; a shape's first step eager, its
                  graph captured when it comes again
    thaw-first    thaw's, each shape captured the first time it comes
    thaw-ahead    thaw's, with the next step prepared while one runs
                  (``use_async_batching``)
    thaw-masks    thaw's, its graphed steps under masks of their own size too
                  (``step_masks_in_graphs``: no dense mask as wide as the cache)

At each level, ``streams`` seeded requests (temperature 1, 64 tokens) at once, a thread
each, as bench/llm.py's engine mode; a level's first two rounds capture the shapes it
meets and are not counted (``--rounds`` counts them), the figures are the medians of
the rest. ``--spread-ms`` sends each round's requests at random offsets over that many
ms instead of at once, as requests reach a server's engine one by one; the table then
shows the graphs each counted round captured (a shape met for the first time) and the
time spent capturing. The table also shows each setting's first request (the batch
starts then: a dense mask is allocated and filled) and the dense mask's size. Four
greedy prompts are run first under each setting; the table says whether their tokens
equal the first setting's. Needs a CUDA device for every setting but ``eager`` and
``eager-dense`` (graphs are CUDA's); ``--device cpu`` runs them all eagerly, as a check.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console

from bench import _llm_baselines as base
from bench._common import (
    Column,
    TableSpec,
    machine_description,
    no_cuda,
    render_table,
    write_json,
)
from bench.llm import level_row, model_dir_of, sizes_of

SETTINGS = (
    "eager",
    "eager-dense",
    "transformers",
    "thaw",
    "thaw-first",
    "thaw-ahead",
    "thaw-masks",
)
UNCOUNTED_ROUNDS = 2  # a level's first rounds capture the shapes it meets
GREEDY_TOKENS = 24
LEVEL_FIGURES = ("streams", "rounds", "tokens_per_s", "ttft_p50_ms", "tpot_p50_ms")


@contextmanager
def timed_captures() -> Iterator[list[float]]:
    """The seconds of each CUDA graph capture the engines' steps make meanwhile."""
    from transformers.generation.continuous_batching.model_runner import ModelRunner

    made = ModelRunner._capture_graph
    seconds: list[float] = []

    def capture(self: Any, *args: Any) -> None:
        start = time.perf_counter()
        try:
            made(self, *args)
        finally:
            seconds.append(time.perf_counter() - start)

    ModelRunner._capture_graph = capture  # type: ignore[method-assign,assignment]
    try:
        yield seconds
    finally:
        ModelRunner._capture_graph = made  # type: ignore[method-assign]


@contextmanager
def transformers_config(**overrides: Any) -> Iterator[None]:
    """``ContinuousBatchingConfig`` built with ``overrides`` over what the engine asks."""
    import transformers.generation as generation

    made = generation.ContinuousBatchingConfig

    def config(**kwargs: Any) -> Any:
        return made(**{**kwargs, **overrides})

    generation.ContinuousBatchingConfig = config  # type: ignore[misc,assignment]
    try:
        yield
    finally:
        generation.ContinuousBatchingConfig = made  # type: ignore[misc]


def overrides_of(setting: str, device: str) -> dict[str, Any]:
    """What ``setting`` changes in the engine's transformers config on ``device``."""
    if setting == "transformers":
        return {"q_padding_interval_size": 0, "kv_padding_interval_size": 0}
    if setting == "thaw-ahead":  # transformers prepares a step ahead on CUDA only
        return {"use_async_batching": device == "cuda"}
    return {}


def run_setting(
    setting: str, model: Any, tokenizer: Any, sizes: dict[str, int], args: argparse.Namespace
) -> dict[str, Any]:
    from worker.llm.engine import GRAPH_CAPTURE_AT, Engine, Sampling

    eager = setting.startswith("eager")
    engine_sizes = replace(base.engine_sizes(sizes), cuda_graphs=not eager)
    capture_at = 1 if setting in ("transformers", "thaw-first") else GRAPH_CAPTURE_AT
    with transformers_config(**overrides_of(setting, args.device)):
        engine = Engine(
            model,
            engine_sizes,
            eos_token_ids=base.eos_ids(model),
            capture_at=capture_at,
            step_masks=setting != "eager-dense",
            step_masks_in_graphs=setting == "thaw-masks",
        )
    try:
        ran = base.InProcess(engine, tokenizer, [tokenizer(p)["input_ids"] for p in base.PROMPTS])
        start = time.perf_counter()
        for _ in engine.generate(ran.ids[0], Sampling(1)):
            pass
        first_ms = (time.perf_counter() - start) * 1000
        greedy = [
            [t for step in engine.generate(ids, Sampling(GREEDY_TOKENS)) for t in step.token_ids]
            for ids in ran.ids[:4]
        ]
        levels = []
        for streams in args.streams:
            rounds, captures = [], []
            for n in range(args.rounds):
                with timed_captures() as seconds:
                    rounds.append(ran.level(streams, args.max_tokens, args.spread_ms / 1000, n))
                captures.append(seconds)
            skip = UNCOUNTED_ROUNDS if args.rounds > UNCOUNTED_ROUNDS else args.rounds - 1
            row = level_row(streams, rounds[skip:], math.inf, math.inf)  # no SLOs: no goodput
            level = {key: row[key] for key in LEVEL_FIGURES}
            level["captures"] = statistics.median(len(c) for c in captures[skip:])
            level["capture_ms"] = statistics.median(sum(c) * 1000 for c in captures[skip:])
            level["captures_per_round"] = [len(c) for c in captures]
            levels.append(level)
        return {
            "setting": setting,
            "graphs": engine.cuda_graphs,
            "greedy": greedy,
            "first_request_ms": first_ms,
            "dense_mask_mb": dense_mask_bytes(engine) / 2**20,
            "levels": levels,
        }
    finally:
        engine.close()


def dense_mask_bytes(engine: Any) -> int:
    """The bytes of the dense attention mask ``engine``'s batch keeps (0: none)."""
    masks = engine._manager.batch_processor.model_runner.inputs_and_outputs.attention_mask
    return sum(m.numel() * m.element_size() for m in (masks or {}).values())


def table(results: list[dict[str, Any]], title: str) -> TableSpec:
    first = results[0]
    eager = {
        lv["streams"]: lv["tokens_per_s"]
        for r in results
        if r["setting"] == "eager"
        for lv in r["levels"]
    }
    heads = [
        "setting",
        "graphs",
        "streams",
        "tokens/s",
        "x eager",
        "TTFT p50 ms",
        "TPOT p50 ms",
        "captures a round",
        "capture ms",
        "first request ms",
        "dense mask MB",
        "greedy as " + first["setting"],
    ]
    body = []
    for r in results:
        same = "yes" if r["greedy"] == first["greedy"] else "NO"
        for lv in r["levels"]:
            ratio = lv["tokens_per_s"] / eager[lv["streams"]] if lv["streams"] in eager else None
            body.append(
                [
                    r["setting"],
                    "on" if r["graphs"] else "off",
                    str(lv["streams"]),
                    f"{lv['tokens_per_s']:.1f}",
                    "-" if ratio is None else f"{ratio:.2f}",
                    f"{lv['ttft_p50_ms']:.1f}",
                    f"{lv['tpot_p50_ms']:.2f}",
                    f"{lv['captures']:g}",
                    f"{lv['capture_ms']:.1f}",
                    f"{r['first_request_ms']:.0f}",
                    f"{r['dense_mask_mb']:.0f}",
                    same,
                ]
            )
    return TableSpec(title, [Column(h) for h in heads], body)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", help="a model directory (default: the bench's example model)")
    p.add_argument("--quick", action="store_true", help="the tiny example model")
    p.add_argument("--streams", default="8,32")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument(
        "--spread-ms",
        type=float,
        default=0.0,
        help="send each round's requests at random offsets over this many ms (default: at once)",
    )
    p.add_argument("--settings", default=",".join(SETTINGS))
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--max-batch-tokens", type=int, default=512)
    p.add_argument("--kv-cache-mb", type=int, default=256)
    p.add_argument("--data-dir", type=Path, default=Path(__file__).resolve().parent / ".data")
    p.add_argument("--json", dest="json_out", help="also write the figures as JSON (- for stdout)")
    args = p.parse_args(argv)
    args.streams = [int(s) for s in args.streams.split(",")]
    settings = args.settings.split(",")
    if unknown := sorted(set(settings) - set(SETTINGS)):
        p.error(f"--settings: unknown {', '.join(unknown)} (of {', '.join(SETTINGS)})")
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    if args.device == "cuda" and (why := no_cuda()) is not None:
        p.error(f"--device cuda: {why}")
    model_dir, sizes = model_dir_of(args), sizes_of(args)
    model, tokenizer = base.load(model_dir, args.device)
    results = []
    for setting in settings:
        results.append(run_setting(setting, model, tokenizer, sizes, args))
        print(f"{setting}: done", file=sys.stderr, flush=True)
    arrivals = f"sent over {args.spread_ms:g} ms" if args.spread_ms > 0 else "sent at once"
    title = (
        f"{model_dir.name} on {args.device}: {args.max_tokens} tokens a stream, {arrivals};"
        f" medians of the rounds after the first {UNCOUNTED_ROUNDS}"
    )
    render_table(table(results, title), Console(width=None if sys.stdout.isatty() else 200))
    if args.json_out:
        doc = {"machine": machine_description(), "model": str(model_dir), "results": results}
        write_json(doc, args.json_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
