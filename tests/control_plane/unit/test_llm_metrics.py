"""An ended LLM call's figures as the token-level histograms and counters (named
after vLLM's), from made-up timings; a call that counted no tokens adds nothing."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from control_plane.metrics_llm import LLMMetrics
from control_plane.protocol import TokenUsage
from control_plane.services.llm_metrics import observe_llm_call


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_an_llm_call_feeds_every_histogram_and_both_token_counters() -> None:
    registry = CollectorRegistry()
    m = LLMMetrics(registry)
    timings = {"queue_wait": 300.0, "ttft": 20.0, "tpot": 5.0, "engine_queue": 2.0}
    usage = TokenUsage(prompt_tokens=12, completion_tokens=4)
    observe_llm_call(m, "chat", True, 0.4, timings, usage, [4.0, 5.0, 6.0])
    cold = {"function": "chat", "cold": "true"}
    assert _value(registry, "thaw_llm_prompt_tokens_total", function="chat") == 12
    assert _value(registry, "thaw_llm_generation_tokens_total", function="chat") == 4
    # what the caller felt: the wait for the replica (its cold start) and then the token
    ttft = "thaw_llm_time_to_first_token_seconds"
    assert _value(registry, f"{ttft}_sum", **cold) == pytest.approx(0.32)
    assert _value(registry, f"{ttft}_bucket", **cold, le="0.25") == 0
    assert _value(registry, f"{ttft}_bucket", **cold, le="0.5") == 1
    itl = "thaw_llm_inter_token_latency_seconds"
    assert _value(registry, f"{itl}_count", function="chat") == 3
    assert _value(registry, f"{itl}_sum", function="chat") == pytest.approx(0.015)
    tpot = "thaw_llm_request_time_per_output_token_seconds"
    assert _value(registry, f"{tpot}_sum", function="chat") == pytest.approx(0.005)
    queue = "thaw_llm_request_queue_time_seconds"
    assert _value(registry, f"{queue}_sum", function="chat") == pytest.approx(0.002)
    e2e = "thaw_llm_e2e_request_latency_seconds"
    assert _value(registry, f"{e2e}_sum", **cold) == pytest.approx(0.4)


def test_a_call_without_tokens_or_timings_adds_only_what_it_has() -> None:
    registry = CollectorRegistry()
    m = LLMMetrics(registry)
    observe_llm_call(m, "plain", False, 0.1, {"ttft": 1.0}, None, [1.0])
    assert (
        registry.get_sample_value(
            "thaw_llm_time_to_first_token_seconds_count", {"function": "plain", "cold": "false"}
        )
        is None
    )
    usage = TokenUsage(prompt_tokens=3, completion_tokens=0)  # failed before a token
    observe_llm_call(m, "chat", False, 0.1, {}, usage, None)
    assert _value(registry, "thaw_llm_prompt_tokens_total", function="chat") == 3
    warm = {"function": "chat", "cold": "false"}
    assert _value(registry, "thaw_llm_time_to_first_token_seconds_count", **warm) == 0
    assert _value(registry, "thaw_llm_e2e_request_latency_seconds_count", **warm) == 1
