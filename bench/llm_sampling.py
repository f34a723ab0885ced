"""What per-request penalties and logprobs cost a batch, against plain sampling, on one
engine in this process:

    python bench/llm_sampling.py [--model DIR] [--quick] [--streams 1,8] [--rounds 5]
                                 [--max-tokens 32] [--top-logprobs 5]
                                 [--max-num-seqs 32 --max-batch-tokens 512 --kv-cache-mb 256]
                                 [--json -|PATH]

One LLM replica as thaw's LLM functions run it (``worker.llm.serve.LLMReplica``); at
each level, ``streams`` requests at once, a thread each, temperature 1, seed ``i``,
``--max-tokens`` tokens (past the end of text), prompts of varied lengths, in four modes:

    plain       nothing more: the processors' cost when no request asks (a dict
                lookup per request and step)
    penalties   repetition 1.1, frequency 0.5 and presence 0.5 on every request
                (``worker.llm.penalties``: each row's tokens gathered and scattered)
    logprobs    every request asks for each token's logprob and the top
                ``--top-logprobs`` (``worker.llm.logprobs``: the rows' raw logits
                kept, their log-softmax and top n after the step, each entry's text)
    all         the penalties, logprobs, min_p 0.05 and a logit bias on 64 tokens
                together (a bias of 0: a bias's work, without changing which tokens
                come; on the example's 320-token vocabulary a real one moved the first
                text later, into characters cut across tokens)

The modes take turns round by round on the same engine; every figure is the median
over rounds, and the ratios are against plain at the same level. A second table times
the processors alone, as a step runs them (prepared, applied, and for logprobs
collected), for as many rows as each level has streams, against that level's plain
time per token: on a small machine the end-to-end ratios move by a few percent from
round to round, the processors' own time does not.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console

from bench import _llm_baselines as base
from bench._common import Column, TableSpec, machine_description, render_table, write_json
from bench.llm import level_row, model_dir_of, sizes_of
from bench.llm_adapters import replica

PLAIN, PENALTIES, LOGPROBS, ALL = "plain", "penalties", "logprobs", "all"
MODES = (PLAIN, PENALTIES, LOGPROBS, ALL)
PENALTY_VALUES = {"repetition_penalty": 1.1, "frequency_penalty": 0.5, "presence_penalty": 0.5}
TEXT = (
    "Every cold start is a list of phases: the pool hit, the weights streamed from the"
    " store, the engine started and the first token made. "
)
BIASED_TOKENS = 64
PROMPT_TOKENS = (12, 40, 96, 24, 64, 160, 8, 120)  # varied, as a chat's turns are


def mode_values(mode: str, top_logprobs: int, vocab_size: int) -> dict[str, Any]:
    """What ``mode`` adds to a request's sampling."""
    values: dict[str, Any] = {}
    if mode in (PENALTIES, ALL):
        values.update(PENALTY_VALUES)
    if mode in (LOGPROBS, ALL):
        values["logprobs"] = top_logprobs
    if mode == ALL:
        values["min_p"] = 0.05
        biased = range(vocab_size - BIASED_TOKENS, vocab_size)
        values["logit_bias"] = tuple((token, 0.0) for token in biased)
    return values


def prompts_of(llm: Any) -> list[list[int]]:
    ids = llm.text_prompt(TEXT * 20)
    return [ids[i : i + n] for i, n in enumerate(PROMPT_TOKENS)]


class Answered:
    """What a level's streams were handed beside their timings: logprob entries, and
    how many of them had as many alternatives as asked."""

    def __init__(self) -> None:
        self.tokens = self.entries = self.full = 0
        self._lock = threading.Lock()

    def add(self, tokens: int, entries: list[dict[str, Any]], top: int | None) -> None:
        with self._lock:
            self.tokens += tokens
            self.entries += len(entries)
            self.full += sum(len(e["top_logprobs"]) == top for e in entries)


def one(
    llm: Any, ids: list[int], sampling: Any, t0: float, answered: Answered
) -> base.StreamTiming:
    sent = time.perf_counter() - t0
    first, tokens = None, 0
    entries: list[dict[str, Any]] = []
    for delta in llm.stream(ids, sampling):
        if first is None and delta.text:
            first = time.perf_counter() - t0
        tokens += delta.tokens
        entries += delta.logprobs or []
    answered.add(tokens, entries, sampling.logprobs)
    return base.StreamTiming(sent, first, time.perf_counter() - t0, tokens)


def level(
    llm: Any,
    prompts: list[list[int]],
    streams: int,
    max_tokens: int,
    values: dict[str, Any],
    answered: Answered,
) -> base.Level:
    """``streams`` requests at once, a thread each: request ``i`` is prompt
    ``i % len(prompts)``, seed ``i``, with ``values``."""
    from worker.llm.engine import Sampling

    out: list[base.StreamTiming | None] = [None] * streams
    t0 = time.perf_counter()

    def run(i: int) -> None:
        sampling = Sampling(
            max_new_tokens=max_tokens, temperature=1.0, seed=i, ignore_eos=True, **values
        )
        out[i] = one(llm, prompts[i % len(prompts)], sampling, t0, answered)

    base.in_threads(streams, run)
    return [t for t in out if t is not None]


def run(args: argparse.Namespace) -> dict[str, Any]:
    model_dir, sizes = model_dir_of(args), sizes_of(args)
    with replica(model_dir, [], sizes, False) as llm:
        prompts = prompts_of(llm)
        vocab = llm.engine.vocab_size
        warm = mode_values(ALL, args.top_logprobs, vocab)
        level(llm, prompts, 2, 4, warm, Answered())  # every path once
        rows = []
        for streams in args.streams:
            rounds: dict[str, list[base.Level]] = {m: [] for m in MODES}
            answered = {m: Answered() for m in MODES}
            for n in range(args.rounds):
                turn = MODES[n % len(MODES) :] + MODES[: n % len(MODES)]
                for mode in turn:
                    values = mode_values(mode, args.top_logprobs, vocab)
                    got = level(llm, prompts, streams, args.max_tokens, values, answered[mode])
                    rounds[mode].append(got)
            for mode in MODES:
                row = level_row(streams, rounds[mode], 1e9, 1e9)
                a = answered[mode]
                row.update(tokens=a.tokens, logprob_entries=a.entries, full_entries=a.full)
                rows.append({"mode": mode, **row})
            print(f"{streams} streams: done", file=sys.stderr, flush=True)
        costs = processor_costs(vocab, args.streams, args.top_logprobs)
    return {
        "model": str(model_dir),
        "max_tokens": args.max_tokens,
        "top_logprobs": args.top_logprobs,
        "sizes": sizes,
        "rows": rows,
        "processors": costs,
    }


def processor_costs(vocab_size: int, row_counts: list[int], top: int) -> list[dict[str, Any]]:
    """Each processor's time a step, alone on the CPU: its rows' requests with a
    160-token prompt and 64 tokens made, as a step prepares and applies it (and for
    logprobs collects them), median of 7 runs of 50 steps."""
    import torch
    from transformers.generation.continuous_batching.requests import (
        FutureRequestState,
        RequestState,
    )

    from worker.llm.engine import Sampling
    from worker.llm.logprobs import StepLogprobs
    from worker.llm.penalties import Penalties

    def requests(rows: int, mode: str) -> list[Any]:
        kwargs = Sampling(2, **mode_values(mode, top, vocab_size)).processor_kwargs(vocab_size)
        out = []
        for i in range(rows):
            state = RequestState(
                request_id=f"r{i}",
                initial_tokens=[t % vocab_size for t in range(100, 260)],
                logit_processor_kwargs=kwargs,
            )
            state.generated_tokens = [t % vocab_size for t in range(300, 364)]
            out.append(
                FutureRequestState(state, has_new_token=True, complete_blocks={}, query_length=1)
            )
        return out

    cpu = torch.device("cpu")
    out = []
    for rows in row_counts:
        scores = torch.randn(rows, vocab_size)
        sampled = torch.zeros(rows, dtype=torch.int32)
        for name, mode, processor in (
            ("penalties", PENALTIES, Penalties(None, vocab_size, cpu)),
            ("logprobs", LOGPROBS, StepLogprobs(None, vocab_size, cpu)),
        ):
            batch = requests(rows, mode)
            runs = [_steps(processor, scores, batch, sampled, 50) for _ in range(7)]
            out.append({"processor": name, "rows": rows, "ms_per_step": statistics.median(runs)})
    return out


def _steps(processor: Any, scores: Any, batch: list[Any], sampled: Any, n: int) -> float:
    """Milliseconds a step of ``processor`` over ``batch``, the mean of ``n``."""
    t = time.perf_counter()
    for _ in range(n):
        processor(scores, processor.prepare_tensor_args(batch))
        if hasattr(processor, "collect"):
            processor.collect(sampled)
    return (time.perf_counter() - t) / n * 1000


def table(result: dict[str, Any]) -> TableSpec:
    plain = {r["streams"]: r for r in result["rows"] if r["mode"] == PLAIN}
    heads = ["mode", "streams", "tokens/s", "x plain", "TPOT p50 ms", "x plain", "TTFT p50 ms"]
    body = []
    for r in result["rows"]:
        other = plain[r["streams"]]
        body.append(
            [
                r["mode"],
                str(r["streams"]),
                f"{r['tokens_per_s']:.1f}",
                f"{r['tokens_per_s'] / other['tokens_per_s']:.2f}",
                f"{r['tpot_p50_ms']:.2f}",
                f"{r['tpot_p50_ms'] / other['tpot_p50_ms']:.2f}",
                f"{r['ttft_p50_ms']:.1f}",
            ]
        )
    model = Path(result["model"])
    title = (
        f"{model.parent.name}/{model.name}: per-request penalties and logprobs (top"
        f" {result['top_logprobs']}) against plain sampling, {result['max_tokens']} tokens a"
        " stream, one engine, medians over rounds"
    )
    return TableSpec(title, [Column(h) for h in heads], body)


def cost_table(result: dict[str, Any]) -> TableSpec:
    plain = {r["streams"]: r for r in result["rows"] if r["mode"] == PLAIN}
    body = [
        [
            c["processor"],
            str(c["rows"]),
            f"{c['ms_per_step']:.3f}",
            f"{c['ms_per_step'] / plain[c['rows']]['tpot_p50_ms']:.1%}",
        ]
        for c in result["processors"]
    ]
    heads = ["processor", "rows", "ms a step", "of plain TPOT p50"]
    title = "The processors alone, a step's work for that many requests, median of 7 x 50 steps"
    return TableSpec(title, [Column(h) for h in heads], body)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", help="a model directory (default: the bench's example model)")
    p.add_argument("--quick", action="store_true", help="the tiny example model")
    p.add_argument("--streams", default="1,8")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--top-logprobs", type=int, default=5)
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--max-batch-tokens", type=int, default=512)
    p.add_argument("--kv-cache-mb", type=int, default=256)
    p.add_argument("--data-dir", type=Path, default=Path(__file__).resolve().parent / ".data")
    p.add_argument("--json", dest="json_out", help="also write the figures as JSON (- for stdout)")
    args = p.parse_args(argv)
    args.streams = [int(s) for s in args.streams.split(",")]
    if args.rounds < 1 or args.max_tokens < 2 or not 0 <= args.top_logprobs <= 20:
        p.error("--rounds must be at least 1, --max-tokens at least 2, --top-logprobs 0 to 20")
    result = run(args)
    console = Console(width=None if sys.stdout.isatty() else 200)
    render_table(table(result), console)
    render_table(cost_table(result), console)
    if args.json_out:
        write_json({"machine": machine_description(), **result}, args.json_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
