"""LLM streams bench: an LLM function through thaw's OpenAI routes, at 1, 8, ...
concurrent streams: tokens/s, time to first token (TTFT) and time per output token
(TPOT), medians over rounds.

    thaw up                     # or any thaw with an LLM function deployed
    python bench/llm.py [--model chat] [--streams 1,8] [--max-tokens 64] [--rounds 3]
                        [--url URL] [--key KEY] [--json -|PATH]

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
        Column("streams"),
        Column("tokens/s"),
        Column("TTFT p50 ms"),
        Column("TTFT p99 ms"),
        Column("TPOT p50 ms"),
        Column("tokens a round"),
    ]
    body = [
        [
            str(r["streams"]),
            num(r["tokens_per_s"], ".1f"),
            num(r["ttft_p50_ms"], ".1f"),
            num(r["ttft_p99_ms"], ".1f"),
            num(r["tpot_p50_ms"], ".2f"),
            num(r["tokens"], ".0f"),
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
            rows.append(level_row(streams, rounds))
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="chat", help="the LLM function (or function:adapter)")
    p.add_argument("--streams", default="1,8", help="concurrent streams per level, comma-separated")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--url", default=os.environ.get("THAW_SERVER_URL", "http://127.0.0.1:8420"))
    p.add_argument("--key", default=os.environ.get("THAW_API_KEY"))
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
    title = (
        f"{args.model} at {args.url}: {args.max_tokens} tokens a stream, medians of {args.rounds}"
    )
    render_table(table(rows, title), Console())
    if args.json_out:
        doc = {"machine": machine_description(), "model": args.model, "rows": rows}
        write_json_doc({**doc, "max_tokens": args.max_tokens, "rounds": args.rounds}, args.json_out)


if __name__ == "__main__":
    main()
