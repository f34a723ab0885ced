"""What the console shows about an LLM function's tokens: time to first token and
time per output token, cold and warm apart, and tokens a second.

Over the function's most recent succeeded calls that counted tokens (``usage``;
at most ``window`` of them), each call's figures come from what its replica
timed where tokens are made (``worker.llm.function``) plus the wait before the
replica began it (``llm_metrics.ttft_seen_ms``); nothing is re-timed here::

    ttft_ms        queue_wait + ttft   accepted to the first token: what the caller
                                       felt, a cold start included (as
                                       ``metrics_llm``'s time_to_first_token)
    tpot_ms        tpot                the mean gap per output token after the first
                                       (calls of two tokens or more)
    generation_ms  ttft - engine_queue + tpot * (completion_tokens - 1)
                                       from the engine taking the request into its
                                       batch to the last token: prefill and decode
    tokens_per_s   completion_tokens / generation_ms * 1000

Percentiles are nearest-rank (``services.stats.percentile``). The window's
overall tokens a second is its completion tokens over its generation time, so
long calls weigh as much as the tokens they made.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from control_plane.db.models import Call
from control_plane.protocol import TokenUsage
from control_plane.services.llm_metrics import MS_PER_S, ttft_seen_ms
from control_plane.services.stats import (
    DEFAULT_WINDOW,
    LatencySummary,
    function_row,
    percentile,
    summarize,
)


@dataclass(frozen=True)
class TokenCall:
    """One LLM call's token figures (see the module docstring)."""

    accepted_at: float
    cold: bool
    prompt_tokens: int
    completion_tokens: int
    ttft_ms: float | None
    tpot_ms: float | None
    generation_ms: float | None
    tokens_per_s: float | None


@dataclass(frozen=True)
class ColdWarm:
    cold: LatencySummary
    warm: LatencySummary


@dataclass(frozen=True)
class TokenRate:
    count: int
    p50: float | None
    p99: float | None
    overall: float | None  # the window's completion tokens over its generation time


@dataclass(frozen=True)
class LLMStats:
    name: str
    calls: int
    prompt_tokens: int
    completion_tokens: int
    ttft: ColdWarm
    tpot: ColdWarm
    tokens_per_s: TokenRate
    points: list[TokenCall]  # newest first


def generation_ms(timings_ms: dict[str, float], completion_tokens: int) -> float | None:
    """From the engine taking the request in to its last token; None: no token came."""
    if "ttft" not in timings_ms or completion_tokens < 1:
        return None
    prefill_ms = timings_ms["ttft"] - timings_ms.get("engine_queue", 0.0)
    decode_ms = timings_ms.get("tpot", 0.0) * (completion_tokens - 1)
    return max(0.0, prefill_ms + decode_ms)


def token_call(
    accepted_at: float, cold: bool, timings_ms: dict[str, float], usage: TokenUsage
) -> TokenCall:
    gen_ms = generation_ms(timings_ms, usage.completion_tokens)
    return TokenCall(
        accepted_at=accepted_at,
        cold=cold,
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        ttft_ms=ttft_seen_ms(timings_ms),
        tpot_ms=timings_ms.get("tpot"),
        generation_ms=gen_ms,
        tokens_per_s=usage.completion_tokens / gen_ms * MS_PER_S if gen_ms else None,
    )


def _cold_warm(calls: list[TokenCall], figure: str) -> ColdWarm:
    def values(cold: bool) -> list[float]:
        return [v for c in calls if c.cold is cold and (v := getattr(c, figure)) is not None]

    return ColdWarm(cold=summarize(values(True)), warm=summarize(values(False)))


def token_rate(calls: list[TokenCall]) -> TokenRate:
    rates = [c.tokens_per_s for c in calls if c.tokens_per_s is not None]
    timed = [c for c in calls if c.generation_ms]
    total_ms = sum(c.generation_ms or 0.0 for c in timed)
    overall = sum(c.completion_tokens for c in timed) / total_ms * MS_PER_S if total_ms else None
    return TokenRate(
        count=len(rates), p50=percentile(rates, 50), p99=percentile(rates, 99), overall=overall
    )


def summarize_calls(name: str, calls: list[TokenCall]) -> LLMStats:
    """The figures of ``calls`` (newest first), as the module docstring defines them."""
    return LLMStats(
        name=name,
        calls=len(calls),
        prompt_tokens=sum(c.prompt_tokens for c in calls),
        completion_tokens=sum(c.completion_tokens for c in calls),
        ttft=_cold_warm(calls, "ttft_ms"),
        tpot=_cold_warm(calls, "tpot_ms"),
        tokens_per_s=token_rate(calls),
        points=calls,
    )


def llm_stats(session: Session, name: str, window: int = DEFAULT_WINDOW) -> LLMStats:
    """Token figures of ``name``'s last ``window`` succeeded LLM calls; a function
    that is not an LLM function has none (``calls == 0``)."""
    function_row(session, name)
    rows = session.execute(
        select(Call.accepted_at, Call.cold, Call.timings_json, Call.usage_json)
        .where(Call.function == name, Call.status == "succeeded", Call.usage_json.is_not(None))
        .order_by(Call.accepted_at.desc())
        .limit(max(1, window))
    ).all()
    calls = [
        token_call(
            r.accepted_at,
            r.cold,
            json.loads(r.timings_json),
            TokenUsage.model_validate_json(r.usage_json),
        )
        for r in rows
    ]
    return summarize_calls(name, calls)
