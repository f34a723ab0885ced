"""LLM benchmark: thaw's OpenAI routes beside the same engine in-process, sequential
``generate`` and ``transformers serve``, at 1, 8 and 32 concurrent streams; and the LLM
cold start from zero against a naive one. One model, one prompt set, one run.

    python bench/llm.py [--model DIR] [--quick] [--streams 1,8,32] [--max-tokens 64]
                        [--rounds 3] [--warm-rounds 0] [--cold-trials 3]
                        [--skip narrow,serve,generate,engine,cold]
                        [--max-num-seqs 32 --max-batch-tokens 512 --kv-cache-mb 256]
                        [--slo-ttft-ms 500 --slo-tpot-ms 50] [--server-processes 1]
                        [--json -|PATH] [--markdown]
    python bench/llm.py --url URL --function NAME [--key KEY] [--model DIR] ...
    thaw bench llm [--model DIR] ...     (the same, from a checkout)

``--model`` is a Hugging Face model directory (safetensors; any causal LM transformers
loads); without it, the cold-start bench's example (a 76M-parameter Llama made
locally, random weights; ``--quick``: the tiny one). thaw runs as a private
installation (``bench._llm_stack``): the model pushed to a scratch store and served
as an LLM function with the sizes given, which the in-process engine gets too. With
``--url`` the function NAME of a running thaw is measured instead (no cold starts;
``--model`` then adds the baselines on that directory). thaw also runs with its off
switch, a second function on the same worker: on a CPU its wide steps off
(``worker.llm.threads``: every engine step on the replica's own threads), on a GPU its
CUDA graphs off (``worker.llm.engine``: every step eager); the engine in this
process is loaded beside thaw's replicas (the model twice in memory), and a round of
each of the three runs in turn, so the machine's drift (±30% between runs on a shared
VM) hits all alike. What thaw's idle processes take from the engine meanwhile is
shown, in cores.

TTFT at one stream is also read apart (``--ttft-trials``, 4-token completions): thaw
through a raw HTTP/1.1 reader and through the ``openai`` SDK, and the engine in this
process (loaded beside thaw's replica for these calls), alternated call by call, since
the machine's drift between runs is larger than what thaw adds; the raw reader's
figure over the engine's is what thaw adds as a server, the SDK's what a user's
client adds on top of it.

Each stream is a streamed completion with usage (thaw, ``transformers serve``) or a
generate call (in-process), timed on the client: TTFT from the level's start to the
first text (in-process too: tokens decoded as they come), TPOT the mean gap after
it; a level's tokens/s is its completion tokens over the time from its start to its
last stream's end; goodput is the share of its streams within both SLOs. Every
figure is the median over rounds; each mode has a warm-up call first. How the
baselines run: ``bench._llm_baselines``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console

from bench import _cpu
from bench import _llm_baselines as base
from bench._common import (
    Column,
    TableSpec,
    machine_description,
    markdown_table,
    median_phases,
    no_cuda,
    percentile,
    render_table,
)
from bench._common import write_json as write_json_doc

THAW = "thaw (OpenAI routes)"
THAW_NARROW = "thaw, wide steps off"  # its off switch: every step on the replica's threads
THAW_EAGER = "thaw, CUDA graphs off"  # its off switch on a GPU: every step eager
ENGINE = "engine in-process"
GENERATE = "sequential generate"
SERVE = "transformers serve"
SKIPPABLE = ("narrow", "serve", "generate", "engine", "cold")
# Who reads the OpenAI routes' streams (``--client``), as the tables name it.
CLIENTS = {base.RAW: "raw HTTP reader", base.SDK: "openai SDK"}
MODES = (THAW, THAW_NARROW, THAW_EAGER, ENGINE, GENERATE, SERVE)  # the tables' order


def level_row(
    streams: int, rounds: list[base.Level], slo_ttft_ms: float, slo_tpot_ms: float
) -> dict[str, Any]:
    """One table row: medians over rounds of each round's figures."""
    per_round = [_round_figures(timings, slo_ttft_ms, slo_tpot_ms) for timings in rounds]
    row: dict[str, Any] = {"streams": streams, "rounds": len(rounds)}
    for key in per_round[0]:
        values = [v for r in per_round if (v := r[key]) is not None]
        row[key] = statistics.median(values) if values else None
    return row


def _round_figures(
    timings: base.Level, slo_ttft_ms: float, slo_tpot_ms: float
) -> dict[str, float | None]:
    span = max(t.end_s for t in timings) - min(t.sent_s for t in timings)
    tokens = sum(t.tokens for t in timings)
    ttfts = [t.ttft_s * 1000 for t in timings if t.ttft_s is not None]
    tpots = [t.tpot_s * 1000 for t in timings if t.tpot_s is not None]

    def good(t: base.StreamTiming) -> bool:
        ttft_ok = t.ttft_s is not None and t.ttft_s * 1000 <= slo_ttft_ms
        return ttft_ok and (t.tpot_s is None or t.tpot_s * 1000 <= slo_tpot_ms)

    return {
        "tokens": tokens,
        "tokens_per_s": tokens / span if span > 0 else None,
        "ttft_p50_ms": percentile(ttfts, 50) if ttfts else None,
        "ttft_p99_ms": percentile(ttfts, 99) if ttfts else None,
        "tpot_p50_ms": percentile(tpots, 50) if tpots else None,
        "tpot_p99_ms": percentile(tpots, 99) if tpots else None,
        "goodput": sum(good(t) for t in timings) / len(timings),
    }


def with_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """thaw's rows with their tokens/s over each baseline's at the same level, the TTFT
    p50 thaw adds over the in-process engine, and thaw's TTFT p99 over its p50."""
    by = {(r["mode"], r["streams"]): r for r in rows}
    out = []
    for r in rows:
        if r["mode"] in (THAW, THAW_NARROW, THAW_EAGER):
            r = dict(r)
            baselines = (("vs_engine", ENGINE), ("vs_generate", GENERATE), ("vs_serve", SERVE))
            for key, mode in baselines:
                other = by.get((mode, r["streams"]))
                if other and other["tokens_per_s"] and r["tokens_per_s"] is not None:
                    r[key] = r["tokens_per_s"] / other["tokens_per_s"]
            engine = by.get((ENGINE, r["streams"]))
            if engine and engine["ttft_p50_ms"] is not None and r["ttft_p50_ms"] is not None:
                r["ttft_added_ms"] = r["ttft_p50_ms"] - engine["ttft_p50_ms"]
            if r["ttft_p50_ms"] and r["ttft_p99_ms"] is not None:
                r["ttft_p99_over_p50"] = r["ttft_p99_ms"] / r["ttft_p50_ms"]
        out.append(r)
    return out


def cpu_per_token(
    levels: list[int], by_level: list[list[base.Level]], cpu: base.CpuSplit
) -> list[dict[str, Any]]:
    """thaw's CPU per completion token at each level, by part (all its rounds)."""
    rows = []
    for streams, rounds, spent in zip(levels, by_level, cpu.levels, strict=True):
        tokens = sum(t.tokens for timings in rounds for t in timings)
        if tokens:
            ms = {part: s * 1000 / tokens for part, s in spent.items()}
            rows.append({"streams": streams, "tokens": tokens, "ms_per_token": ms})
    return rows


def cpu_table(rows: list[dict[str, Any]]) -> TableSpec:
    parts = list(_cpu.STACK_PARTS)
    columns = [Column("streams"), *(Column(f"{p} ms") for p in parts), Column("thaw in all ms")]
    body = [
        [
            str(r["streams"]),
            *(f"{r['ms_per_token'][p]:.3f}" for p in parts),
            f"{sum(v for p, v in r['ms_per_token'].items() if p != 'clients'):.3f}",
        ]
        for r in rows
    ]
    title = "thaw's CPU per completion token, by process (clients: the bench's own)"
    return TableSpec(title, columns, body)


def _num(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def streams_table(rows: list[dict[str, Any]], title: str) -> TableSpec:
    heads = ["mode", "streams", "tokens/s", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms"]
    heads += ["TPOT p99 ms", "goodput", "x engine", "x generate", "x serve", "TTFT added ms"]
    columns = [Column(h, justify="left" if h == "mode" else "right") for h in heads]
    body = [
        [
            r["mode"],
            str(r["streams"]),
            _num(r["tokens_per_s"], ".1f"),
            _num(r["ttft_p50_ms"], ".1f"),
            _num(r["ttft_p99_ms"], ".1f"),
            _num(r["tpot_p50_ms"], ".2f"),
            _num(r["tpot_p99_ms"], ".2f"),
            _num(None if r["goodput"] is None else r["goodput"] * 100, ".0f") + "%",
            _num(r.get("vs_engine"), ".2f"),
            _num(r.get("vs_generate"), ".2f"),
            _num(r.get("vs_serve"), ".2f"),
            _num(r.get("ttft_added_ms"), ".1f"),
        ]
        for r in sorted(rows, key=lambda r: (r["streams"], MODES.index(r["mode"])))
    ]
    return TableSpec(title, columns, body)


def cold_table(cold: dict[str, Any]) -> TableSpec:
    naive, thaw = cold["naive"], cold["thaw"]
    columns = [Column("", justify="left"), Column("first token s"), Column("x naive")]
    columns.append(Column("phases (medians, ms)", justify="left"))
    phases = ", ".join(f"{k} {v:.0f}" for k, v in thaw["phases_ms"].items())
    naive_phases = ", ".join(f"{k[:-2]} {v * 1000:.0f}" for k, v in naive["phases_s"].items())
    body = [
        ["naive (fresh process)", f"{naive['first_token_s']:.3f}", "1.00", naive_phases],
        [
            "thaw from zero (pool hit, RAM tier)",
            f"{thaw['first_token_s']:.3f}",
            f"{thaw['first_token_s'] / naive['first_token_s']:.3f}",
            phases,
        ],
    ]
    title = f"LLM cold start, HTTP to first token: medians of {cold['trials']} trials"
    return TableSpec(title, columns, body)


@dataclass
class Rounds:
    """Each mode's levels, by level then round, from rounds taken in turn."""

    thaw: list[list[base.Level]]
    wide_off: list[list[base.Level]] | None
    engine: list[list[base.Level]] | None
    # thaw's CPU during the engine's rounds, in cores (0.02: 2%); read in /proc's 10 ms
    # ticks, so only rounds of seconds give a figure to go by
    idle_cpu: float | None


def alternated_rounds(
    url: str,
    key: str,
    levels: list[int],
    rounds: int,
    max_tokens: int,
    cpu: base.CpuSplit | None,
    wide_off: str | None,
    engine: base.InProcess | None,
    say: Callable[[str], None],
    client: str = base.RAW,
    warm: int = 0,
) -> Rounds:
    """thaw's levels; with ``wide_off`` (its off-switch function) that function's too,
    and with ``engine`` the engine's in this process; a round of each in turn, so the
    machine's drift hits all alike, after ``warm`` rounds of each that are not counted.
    ``cpu`` gets thaw's CPU per level, summed over its counted rounds, and is read again
    over the engine's: what thaw's idle processes took from the engine beside them."""
    from bench._llm_stack import FUNCTION

    thaw: list[list[base.Level]] = [[] for _ in levels]
    off: list[list[base.Level]] = [[] for _ in levels]
    alone: list[list[base.Level]] = [[] for _ in levels]
    spent: list[dict[str, float]] = [{} for _ in levels]
    idle_s = engine_s = 0.0
    for r in range(warm + rounds):
        counted = r >= warm
        split = None if cpu is None or not counted else base.CpuSplit(cpu.groups)
        for i, [level] in enumerate(
            base.openai_levels(url, key, FUNCTION, levels, 1, max_tokens, split, client)
        ):
            if counted:
                thaw[i].append(level)
        for i, seconds in enumerate([] if split is None else split.levels):
            for part, s in seconds.items():
                spent[i][part] = spent[i].get(part, 0.0) + s
        if wide_off is not None:
            for i, [level] in enumerate(
                base.openai_levels(url, key, wide_off, levels, 1, max_tokens, None, client)
            ):
                if counted:
                    off[i].append(level)
        if engine is not None:
            meter = None if cpu is None or not counted else _cpu.TreeMeter(cpu.groups)
            started = time.perf_counter()
            for i, streams in enumerate(levels):
                level = engine.level(streams, max_tokens)
                if counted:
                    alone[i].append(level)
            if counted:
                engine_s += time.perf_counter() - started
            if meter is not None:
                idle_s += sum(s for part, s in meter.spent_s().items() if part != "clients")
        if counted:
            say(f"thaw: round {r - warm + 1} of {rounds} done")
        else:
            say(f"thaw: warm round {r + 1} of {warm} done (not counted)")
    if cpu is not None:
        cpu.levels = spent
    return Rounds(
        thaw,
        None if wide_off is None else off,
        None if engine is None else alone,
        idle_s / engine_s if cpu is not None and engine_s else None,  # engine_s: it ran
    )


def first_token_figures(
    trials: int, firsts: dict[str, list[float]] | None
) -> dict[str, Any] | None:
    """TTFT at one stream, p50 in ms, by where it was read (``base.first_tokens``, calls
    alternated): thaw through a raw HTTP reader and through the ``openai`` SDK, and the
    engine in-process; thaw's each over the engine's."""
    if not firsts:
        return None
    p50 = (
        {ENGINE: statistics.median(firsts[base.IN_PROCESS]) * 1000}
        if firsts.get(base.IN_PROCESS)
        else {}
    )
    thaw = {f"thaw, {name}": s for name, s in firsts.items() if name != base.IN_PROCESS and s}
    p50 |= {mode: statistics.median(s) * 1000 for mode, s in thaw.items()}
    added = {m: ms - p50[ENGINE] for m, ms in p50.items() if ENGINE in p50 and m != ENGINE}
    figures = {"trials": trials, "max_tokens": base.FIRST_TOKEN_MAX}
    return {**figures, "p50_ms": p50, "added_ms": added}


def first_token_table(figures: dict[str, Any]) -> TableSpec:
    columns = [Column("read by", justify="left"), Column("TTFT p50 ms")]
    columns.append(Column("added over the engine ms"))
    body = [
        [mode, f"{ms:.1f}", _num(figures["added_ms"].get(mode), ".1f")]
        for mode, ms in figures["p50_ms"].items()
    ]
    title = (
        f"TTFT at one stream, {figures['max_tokens']}-token completions: p50 of "
        f"{figures['trials']} calls each, alternated call by call"
    )
    return TableSpec(title, columns, body)


def measure_cold(
    stack: Any,
    model_dir: Path,
    sizes: dict[str, int],
    trials: int,
    say: Callable[[str], None],
    device: str = "cpu",
) -> dict[str, Any]:
    from bench import _llm_stack

    thaw, naive = [], []
    for n in range(trials):  # interleaved, so drift hits both alike
        naive.append(_llm_stack.naive_cold_start(model_dir, sizes, device))
        sample = _llm_stack.thaw_cold_start(stack)
        if not sample["cold"] or not sample["pool_hit"]:
            say(f"  cold trial {n + 1}: not a pool-hit cold start ({sample}); kept, flagged")
        thaw.append(sample)
        say(f"  cold start trial {n + 1}/{trials}: done")
    return {
        "trials": trials,
        "naive": {
            "first_token_s": statistics.median(s["total_s"] for s in naive),
            "phases_s": median_phases([s["phases"] for s in naive]),
        },
        "thaw": {
            "first_token_s": statistics.median(s["first_token_s"] for s in thaw),
            "phases_ms": median_phases([s["phases_ms"] for s in thaw]),
            "all_pool_hits": all(s["pool_hit"] and s["cold"] for s in thaw),
        },
    }


def sizes_of(args: argparse.Namespace) -> dict[str, int]:
    """The engine's sizes as given (``--max-num-seqs``, ``--max-batch-tokens``,
    ``--kv-cache-mb``)."""
    return {
        "max_num_seqs": args.max_num_seqs,
        "max_batch_tokens": args.max_batch_tokens,
        "kv_cache_mb": args.kv_cache_mb,
    }


def model_dir_of(args: argparse.Namespace) -> Path:
    """``--model``, else the example model (made on first use)."""
    if args.model is not None:
        return Path(args.model)
    from bench._coldstart_setup import FULL_MODEL, QUICK_MODEL, ensure_example

    return ensure_example(args.data_dir, QUICK_MODEL if args.quick else FULL_MODEL)["model"]


def check_model_dir(path: Path) -> str | None:
    """Why ``path`` is not a model directory this bench can load, or None (the push
    then checks the rest: ``snapshotter.artifact_dir``)."""
    from snapshotter.artifact_dir import PICKLE_SUFFIXES

    if not path.is_dir():
        return f"{path} is not a directory"
    if not (path / "config.json").is_file():
        return f"{path} has no config.json: give a Hugging Face model directory"
    if not any(path.glob("*.safetensors")):
        pickles = sorted(p.name for p in path.iterdir() if p.suffix.lower() in PICKLE_SUFFIXES)
        hint = f" (it holds {', '.join(pickles)}: convert to safetensors)" if pickles else ""
        return f"{path} has no .safetensors weights{hint}"
    return None


def run(args: argparse.Namespace, say: Callable[[str], None]) -> dict[str, Any]:
    sizes = sizes_of(args)
    model_dir = model_dir_of(args) if args.model or not args.url else None
    if model_dir is not None and (why := check_model_dir(model_dir)) is not None:
        raise SystemExit(f"--model: {why}")
    levels, rounds, n, client = args.streams, args.rounds, args.max_tokens, args.client
    warm = args.warm_rounds
    results: dict[str, list[list[base.Level]]] = {}
    cold = None
    cpu: base.CpuSplit | None = None
    thaw_first: dict[str, list[float]] | None = None
    ttft_trials = args.ttft_trials
    engine: base.InProcess | None = None
    idle_cpu: float | None = None
    with tempfile.TemporaryDirectory(prefix="thaw-bench-llm-") as tmp, ExitStack() as held:
        if args.url:
            url = f"{args.url}/openai/v1"
            fn = args.function
            if warm:
                base.openai_levels(url, args.key, fn, levels, warm, n, None, client)
            results[THAW] = base.openai_levels(url, args.key, fn, levels, rounds, n, None, client)
            if ttft_trials:
                thaw_first = base.first_tokens(url, args.key, args.function, ttft_trials)
        else:
            from bench._llm_stack import FUNCTION, NARROW_FUNCTION, installation

            assert model_dir is not None
            say(f"starting a private thaw with {model_dir} …")
            narrow = "narrow" not in args.skip
            private = installation(
                model_dir, Path(tmp), sizes, max(levels), args.device, narrow, args.server_processes
            )
            with private as stack:
                url, key = f"{stack.url}/openai/v1", stack.admin_key
                groups = _cpu.stack_groups(stack)
                cpu = None if groups is None else base.CpuSplit(groups)
                wide_off = NARROW_FUNCTION if narrow else None
                if "engine" not in args.skip:  # beside thaw, its rounds taken in turn
                    engine = held.enter_context(base.in_process(model_dir, sizes, args.device))
                taken = alternated_rounds(
                    url, key, levels, rounds, n, cpu, wide_off, engine, say, client, warm
                )
                results[THAW] = taken.thaw
                if taken.wide_off is not None:
                    off = THAW_EAGER if args.device == "cuda" else THAW_NARROW
                    results[off] = taken.wide_off
                if taken.engine is not None:
                    results[ENGINE] = taken.engine
                idle_cpu = taken.idle_cpu
                if "cold" not in args.skip:
                    trials = args.cold_trials
                    cold = measure_cold(stack, model_dir, sizes, trials, say, args.device)
                if ttft_trials:  # with the engine's calls in turn, when it runs
                    thaw_first = base.first_tokens(url, key, FUNCTION, ttft_trials, engine=engine)
                    say("TTFT at one stream: done")
        if model_dir is not None and "engine" not in args.skip and ENGINE not in results:
            with base.in_process(model_dir, sizes, args.device) as alone:  # beside --url
                base.engine_levels(alone, levels, warm, n, lambda _: None)  # not counted
                results[ENGINE] = base.engine_levels(alone, levels, rounds, n, say)
        held.close()  # the engine's memory is free for the next mode
        if model_dir is not None and "serve" not in args.skip:
            try:
                log = Path(tmp) / "serve.log"
                with base.transformers_serve(model_dir, sizes, log, args.device) as url:
                    model = str(model_dir)  # transformers serve names a model by its path
                    if warm:
                        base.openai_levels(url, "none", model, levels, warm, n, None, client)
                    served = base.openai_levels(url, "none", model, levels, rounds, n, None, client)
                    results[SERVE] = served
                say("transformers serve: done")
            except RuntimeError as exc:
                say(f"transformers serve could not run: {exc}")
    if model_dir is not None and "generate" not in args.skip:
        results[GENERATE] = base.generate_levels(model_dir, levels, rounds, n, say, args.device)
    rows = [
        {"mode": mode, **level_row(streams, per_level, args.slo_ttft_ms, args.slo_tpot_ms)}
        for mode, by_level in results.items()
        for streams, per_level in zip(levels, by_level, strict=True)
    ]
    cpu_rows = [] if cpu is None else cpu_per_token(levels, results[THAW], cpu)
    return {
        "machine": machine_description(),
        "model": str(model_dir or args.function),
        "sizes": sizes,
        "max_tokens": n,
        "rounds": rounds,
        "warm_rounds": warm,
        "client": client,
        "slo_ttft_ms": args.slo_ttft_ms,
        "slo_tpot_ms": args.slo_tpot_ms,
        "rows": with_ratios(rows),
        "cpu_per_token": cpu_rows,
        "thaw_idle_cpu_beside_engine": idle_cpu,
        "cold_start": cold,
        "first_token": first_token_figures(ttft_trials, thaw_first),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", help="a model directory (default: the bench's example model)")
    p.add_argument("--quick", action="store_true", help="the tiny example model")
    p.add_argument("--streams", default="1,8,32", help="concurrent streams per level")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument(
        "--client",
        choices=(base.RAW, base.SDK),
        default=base.RAW,
        help="what reads the OpenAI routes' streams: a raw HTTP reader, as vLLM's serving"
        " benchmark (default), or the openai SDK (its parsing shares the machine's CPU)",
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--warm-rounds",
        type=int,
        default=0,
        help="rounds at every level run first and not counted, for thaw, its off switch, the"
        " engine and transformers serve (on a GPU a level's first rounds capture the step"
        " shapes they meet)",
    )
    p.add_argument("--cold-trials", type=int, default=3)
    p.add_argument(
        "--ttft-trials", type=int, default=15, help="one-stream TTFT calls per client (0: none)"
    )
    p.add_argument("--skip", default="", help=f"comma-separated, of {', '.join(SKIPPABLE)}")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where models run")
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--max-batch-tokens", type=int, default=512)
    p.add_argument("--kv-cache-mb", type=int, default=256)
    p.add_argument("--slo-ttft-ms", type=float, default=500.0)
    p.add_argument("--slo-tpot-ms", type=float, default=50.0)
    p.add_argument(
        "--server-processes",
        type=int,
        default=1,
        help="the private thaw's control-plane processes (THAW_SERVER_PROCESSES): one takes a"
        " burst's accepts in turn under its interpreter lock; a machine with cores to spare"
        " takes them side by side",
    )
    p.add_argument("--url", help="measure a running thaw instead of a private one")
    p.add_argument("--function", default="chat", help="with --url: the LLM function")
    p.add_argument("--key", default=os.environ.get("THAW_API_KEY"))
    p.add_argument("--data-dir", type=Path, default=Path(__file__).resolve().parent / ".data")
    p.add_argument("--json", dest="json_out", help="also write the figures as JSON (- for stdout)")
    p.add_argument("--markdown", action="store_true", help="print the tables as Markdown")
    args = p.parse_args(argv)
    try:
        args.streams = [int(s) for s in args.streams.split(",")]
    except ValueError:
        p.error(f"--streams takes numbers separated by commas, not {args.streams!r}")
    if not args.streams or min(args.streams) < 1 or args.rounds < 1 or args.max_tokens < 1:
        p.error("--streams, --rounds and --max-tokens must be positive")
    if args.warm_rounds < 0:
        p.error("--warm-rounds must not be negative")
    if args.server_processes < 1:
        p.error("--server-processes must be positive")
    if args.device == "cuda" and (why := no_cuda()) is not None:
        p.error(f"--device cuda: {why}")
    args.skip = {s for s in args.skip.split(",") if s}
    if args.skip - set(SKIPPABLE):
        p.error(f"--skip takes {', '.join(SKIPPABLE)}, not {', '.join(sorted(args.skip))}")
    if args.url and not args.key:
        p.error("--url needs an API key: pass --key or set THAW_API_KEY")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    err = Console(stderr=True)
    try:
        doc = run(args, lambda line: err.print(line, style="dim"))
    except base.StreamRefused as exc:  # a wrong --function or --key, say: no traceback
        raise SystemExit(f"the bench stopped: {exc}") from None
    out = Console(width=None if sys.stdout.isatty() else 220)
    title = (
        f"{doc['model']}: {doc['max_tokens']} tokens a stream, medians of {doc['rounds']}"
        + (f" after {doc['warm_rounds']} warm" if doc["warm_rounds"] else "")
        + f", streams read by the {CLIENTS[doc['client']]}"
    )
    tables = [streams_table(doc["rows"], title)]
    if doc["cpu_per_token"]:
        tables.append(cpu_table(doc["cpu_per_token"]))
    if doc["first_token"] is not None:
        tables.append(first_token_table(doc["first_token"]))
    if doc["cold_start"] is not None:
        tables.append(cold_table(doc["cold_start"]))
    for spec in tables:
        if args.markdown:
            print(f"**{spec.title}**\n\n{markdown_table(spec)}\n")
        else:
            render_table(spec, out)
    if (idle := doc["thaw_idle_cpu_beside_engine"]) is not None:
        line = f"thaw's processes, idle beside the engine's rounds: {idle:.1%} of a core"
        print(f"{line}\n" if args.markdown else line)
    if args.json_out:
        write_json_doc(doc, args.json_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
