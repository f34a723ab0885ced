"""The token figures the console shows for an LLM function (``services.llm_stats``)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from control_plane.protocol import TokenUsage
from control_plane.services.llm_metrics import ttft_seen_ms
from control_plane.services.llm_stats import (
    TokenCall,
    generation_ms,
    summarize_calls,
    token_call,
    token_rate,
)


def test_ttft_seen_adds_the_wait_before_the_replica() -> None:
    assert ttft_seen_ms({"queue_wait": 300.0, "ttft": 20.0}) == 320.0
    assert ttft_seen_ms({"ttft": 20.0}) == 20.0
    assert ttft_seen_ms({"queue_wait": 300.0}) is None  # no token came


def test_generation_runs_from_the_engine_taking_the_request_to_the_last_token() -> None:
    timings = {"engine_queue": 2.0, "ttft": 10.0, "tpot": 4.0}
    assert generation_ms(timings, 6) == 8.0 + 5 * 4.0
    assert generation_ms({"ttft": 10.0}, 1) == 10.0  # one token: prefill only
    assert generation_ms({}, 6) is None
    assert generation_ms({"ttft": 10.0}, 0) is None


def test_a_call_gets_tokens_a_second_of_its_generation() -> None:
    timings = {"queue_wait": 100.0, "engine_queue": 2.0, "ttft": 10.0, "tpot": 4.0}
    c = token_call(1.0, True, timings, TokenUsage(prompt_tokens=5, completion_tokens=6))
    assert (c.ttft_ms, c.tpot_ms, c.generation_ms) == (110.0, 4.0, 28.0)
    assert c.tokens_per_s == pytest.approx(6 / 0.028)


def _call(cold: bool, ttft_ms: float, tpot_ms: float, completion: int) -> TokenCall:
    timings = {"ttft": ttft_ms, "tpot": tpot_ms}
    return token_call(0.0, cold, timings, TokenUsage(prompt_tokens=3, completion_tokens=completion))


def test_summary_splits_cold_and_warm_and_weighs_the_overall_rate_by_time() -> None:
    calls = [_call(False, 10.0, 5.0, 3), _call(False, 30.0, 5.0, 3), _call(True, 900.0, 7.0, 11)]
    s = summarize_calls("chat", calls)
    assert (s.calls, s.prompt_tokens, s.completion_tokens) == (3, 9, 17)
    assert (s.ttft.warm.count, s.ttft.warm.p50_ms, s.ttft.warm.p99_ms) == (2, 10.0, 30.0)
    assert (s.ttft.cold.count, s.ttft.cold.p50_ms) == (1, 900.0)
    assert (s.tpot.warm.p50_ms, s.tpot.cold.p50_ms) == (5.0, 7.0)
    # 3 tokens in 20 ms and 40 ms, 11 in 970 ms: 17 tokens in 1030 ms overall.
    assert s.tokens_per_s.p50 == pytest.approx(75.0)
    assert s.tokens_per_s.p99 == pytest.approx(150.0)
    assert s.tokens_per_s.overall == pytest.approx(17 / 1.030)


def test_no_calls_no_figures() -> None:
    s = summarize_calls("chat", [])
    assert s.calls == 0 and s.ttft.cold.p50_ms is None and s.tokens_per_s.overall is None


@given(
    st.lists(
        st.tuples(st.floats(0.1, 1e4), st.floats(0.1, 1e3), st.integers(1, 4096)),
        min_size=1,
        max_size=30,
    )
)
def test_the_overall_rate_lies_between_the_slowest_and_fastest_call(
    figures: list[tuple[float, float, int]],
) -> None:
    calls = [_call(False, ttft, tpot, n) for ttft, tpot, n in figures]
    rate = token_rate(calls)
    rates = [c.tokens_per_s or 0.0 for c in calls]
    assert rate.count == len(calls) and rate.overall is not None
    assert min(rates) * (1 - 1e-9) <= rate.overall <= max(rates) * (1 + 1e-9)
