"""LLM streams bench: an LLM function through thaw's OpenAI routes, at 1, 8, ...
concurrent streams: tokens/s, time to first token (TTFT) and time per output token
(TPOT), medians over rounds; with ``--model-dir``, side by side with the same engine
in this process with no thaw around it (the ceiling thaw adds its overhead to).

    thaw up                     # or any thaw with an LLM function deployed
    python bench/llm.py [--model chat] [--streams 1,8] [--max-tokens 64] [--rounds 3]
                        [--model-dir DIR [--max-num-seqs 8 --kv-cache-mb 16]]
                        [--url URL] [--key KEY] [--json -|PATH]

``--model-dir`` is the function's model directory (``thaw up``'s is
``$THAW_HOME/example/model``); the in-process engine gets the sizes given, which
should be the function's.

``--url`` and ``--key`` default to ``THAW_SERVER_URL`` and ``THAW_API_KEY`` (``thaw
up`` prints both). Each stream is one ``openai`` SDK call with ``stream=True``,
timed on the client: TTFT from sending the request to the first chunk with text,
TPOT the mean gap after it; tokens are the call's usage. A level's tokens/s is every
completion token of its streams over the time from the first request to the last
stream's end. One warm-up call first, so a cold start is not in the figures.
Prompts come from one set of varied lengths; sampling is seeded per stream.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console

from bench._common import Column, TableSpec, machine_description, percentile, render_table
from bench._common import write_json as write_json_doc

PROMPTS = [
    "Hello",
    "The quick brown fox jumps over the lazy dog",
    "A cold start is the first request after idle, and",
    "Where did every millisecond of the first request go? Tell me in order:",
    "Weights are stored as verified, content-addressed chunks, streamed in the "
    "order a replica first touched them, straight into tensors on the device, so",
]


@dataclass(frozen=True)
class StreamTiming:
    """One stream, in seconds from its level's start (``sent``) or its own."""

    sent_s: float
    first_s: float | None  # None: no text came back
    end_s: float
    tokens: int

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_s is None else self.first_s - self.sent_s

    @property
    def tpot_s(self) -> float | None:
        if self.first_s is None or self.tokens < 2:
            return None
        return (self.end_s - self.first_s) / (self.tokens - 1)


def level_row(streams: int, rounds: list[list[StreamTiming]]) -> dict[str, Any]:
    """One table row: medians over rounds of each round's figures."""
    per_round = [_round_figures(timings) for timings in rounds]
    row: dict[str, Any] = {"streams": streams, "rounds": len(rounds)}
    for key in ("tokens_per_s", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tokens"):
        values = [r[key] for r in per_round if r[key] is not None]
        row[key] = statistics.median(values) if values else None
    return row


def _round_figures(timings: list[StreamTiming]) -> dict[str, Any]:
    span = max(t.end_s for t in timings) - min(t.sent_s for t in timings)
    tokens = sum(t.tokens for t in timings)
    ttfts = sorted(t.ttft_s * 1000 for t in timings if t.ttft_s is not None)
    tpots = sorted(t.tpot_s * 1000 for t in timings if t.tpot_s is not None)
    return {
        "tokens": tokens,
        "tokens_per_s": tokens / span if span > 0 else None,
        "ttft_p50_ms": percentile(ttfts, 50) if ttfts else None,
        "ttft_p99_ms": percentile(ttfts, 99) if ttfts else None,
        "tpot_p50_ms": percentile(tpots, 50) if tpots else None,
    }


def table(rows: list[dict[str, Any]], title: str) -> TableSpec:
    def num(value: Any, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    columns = [
        Column("mode", justify="left"),
        Column("streams"),
        Column("tokens/s"),
        Column("TTFT p50 ms"),
        Column("TTFT p99 ms"),
        Column("TPOT p50 ms"),
        Column("tokens a round"),
        Column("tokens/s vs engine"),
        Column("TTFT p50 added ms"),
    ]
    body = [
        [
            str(r.get("mode", "")),
            str(r["streams"]),
            num(r["tokens_per_s"], ".1f"),
            num(r["ttft_p50_ms"], ".1f"),
            num(r["ttft_p99_ms"], ".1f"),
            num(r["tpot_p50_ms"], ".2f"),
            num(r["tokens"], ".0f"),
            num(r.get("tokens_per_s_vs_engine"), ".2f"),
            num(r.get("ttft_p50_added_ms"), ".1f"),
        ]
        for r in rows
    ]
    return TableSpec(title, columns, body)


async def _stream(client: Any, model: str, i: int, max_tokens: int, t0: float) -> StreamTiming:
    sent = time.perf_counter() - t0
    first, tokens = None, 0
    stream = await client.completions.create(
        model=model,
        prompt=PROMPTS[i % len(PROMPTS)],
        max_tokens=max_tokens,
        temperature=1.0,
        seed=i,
        stream=True,
        stream_options={"include_usage": True},
    )
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].text and first is None:
            first = time.perf_counter() - t0
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return StreamTiming(sent, first, time.perf_counter() - t0, tokens)


async def _level(client: Any, model: str, streams: int, max_tokens: int) -> list[StreamTiming]:
    t0 = time.perf_counter()
    calls = (_stream(client, model, i, max_tokens, t0) for i in range(streams))
    return list(await asyncio.gather(*calls))


def measure_engine(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The same prompts and sampling through ``worker.llm.engine`` in this process: a
    thread per stream, timed as the client times thaw's streams."""
    import threading

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from worker.llm.engine import Engine, EngineSizes, Sampling

    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    model = AutoModelForCausalLM.from_pretrained(
        args.model_dir, dtype=torch.float32, attn_implementation="sdpa"
    ).eval()
    eos = model.config.eos_token_id
    sizes = EngineSizes(
        max_num_seqs=args.max_num_seqs,
        max_batch_tokens=512,
        kv_cache_bytes=args.kv_cache_mb << 20,
    )
    engine = Engine(model, sizes, eos_token_ids=[eos] if isinstance(eos, int) else list(eos or []))
    prompts = [list(tokenizer(p)["input_ids"]) for p in PROMPTS]

    def one(i: int, t0: float, out: list[StreamTiming | None]) -> None:
        sent = time.perf_counter() - t0
        first, tokens = None, 0
        sampling = Sampling(max_new_tokens=args.max_tokens, temperature=1.0, seed=i)
        for step in engine.generate(prompts[i % len(prompts)], sampling):
            if step.token_ids and first is None:
                first = time.perf_counter() - t0
            tokens += len(step.token_ids)
        out[i] = StreamTiming(sent, first, time.perf_counter() - t0, tokens)

    def level(streams: int, max_tokens: int) -> list[StreamTiming]:
        out: list[StreamTiming | None] = [None] * streams
        t0 = time.perf_counter()
        threads = [threading.Thread(target=one, args=(i, t0, out)) for i in range(streams)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return [t for t in out if t is not None]

    try:
        level(1, 4)  # warm-up, as for thaw
        rows = []
        for streams in args.streams:
            rounds = [level(streams, args.max_tokens) for _ in range(args.rounds)]
            print(f"  engine in-process, {streams} streams: done", file=sys.stderr)
            rows.append({"mode": "engine in-process", **level_row(streams, rounds)})
        return rows
    finally:
        engine.close()


async def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    import openai

    client = openai.AsyncOpenAI(base_url=f"{args.url}/openai/v1", api_key=args.key, max_retries=0)
    async with client:
        await _level(client, args.model, 1, 4)  # warm-up: a cold start is not measured
        rows = []
        for streams in args.streams:
            rounds = []
            for n in range(args.rounds):
                rounds.append(await _level(client, args.model, streams, args.max_tokens))
                print(f"  {streams} streams: round {n + 1}/{args.rounds}", file=sys.stderr)
            rows.append({"mode": "thaw (OpenAI routes)", **level_row(streams, rounds)})
    return rows


def _with_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each thaw row with its tokens/s over the in-process engine's at that level, and
    its TTFT p50 over the engine's (what thaw adds); the engine rows as they were."""
    engine = {r["streams"]: r for r in rows if r["mode"] == "engine in-process"}
    out = []
    for r in rows:
        base = engine.get(r["streams"]) if r["mode"] != "engine in-process" else None
        if base is not None and base["tokens_per_s"] and r["tokens_per_s"] is not None:
            r = {**r, "tokens_per_s_vs_engine": r["tokens_per_s"] / base["tokens_per_s"]}
        if base is not None and base["ttft_p50_ms"] is not None and r["ttft_p50_ms"] is not None:
            r = {**r, "ttft_p50_added_ms": r["ttft_p50_ms"] - base["ttft_p50_ms"]}
        out.append(r)
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="chat", help="the LLM function (or function:adapter)")
    p.add_argument("--streams", default="1,8", help="concurrent streams per level, comma-separated")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--url", default=os.environ.get("THAW_SERVER_URL", "http://127.0.0.1:8420"))
    p.add_argument("--key", default=os.environ.get("THAW_API_KEY"))
    p.add_argument("--model-dir", type=Path, help="also the engine in-process on this model")
    p.add_argument("--max-num-seqs", type=int, default=8, help="the in-process engine's batch")
    p.add_argument("--kv-cache-mb", type=int, default=16, help="the in-process engine's KV cache")
    p.add_argument("--json", dest="json_out", help="also write the rows as JSON (- for stdout)")
    args = p.parse_args(argv)
    try:
        args.streams = [int(s) for s in args.streams.split(",")]
    except ValueError:
        p.error(f"--streams takes numbers separated by commas, not {args.streams!r}")
    if not args.streams or min(args.streams) < 1 or args.rounds < 1 or args.max_tokens < 1:
        p.error("--streams, --rounds and --max-tokens must be positive")
    if not args.key:
        p.error("no API key: pass --key or set THAW_API_KEY (thaw up prints it)")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    rows = asyncio.run(measure(args))
    if args.model_dir is not None:
        rows += measure_engine(args)
        rows = _with_ratios(rows)
    title = (
        f"{args.model} at {args.url}: {args.max_tokens} tokens a stream, medians of {args.rounds}"
    )
    render_table(table(rows, title), Console())
    if args.json_out:
        doc = {"machine": machine_description(), "model": args.model, "rows": rows}
        write_json_doc({**doc, "max_tokens": args.max_tokens, "rounds": args.rounds}, args.json_out)


if __name__ == "__main__":
    main()
