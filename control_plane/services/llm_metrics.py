"""Observe an ended LLM call's token-level figures (``control_plane.metrics_llm``).

An LLM call is one whose replica counted tokens (``usage``); its ``timings_ms``
carry what the replica timed (``ttft``, ``tpot``, ``engine_queue``) and the wait
before it began (``queue_wait``), its final event each inter-token gap.
"""

from __future__ import annotations

from collections.abc import Sequence

from control_plane.metrics_llm import LLMMetrics
from control_plane.protocol import TokenUsage

MS_PER_S = 1000.0


def observe_llm_call(
    m: LLMMetrics,
    function: str,
    cold: bool,
    latency_s: float,
    timings_ms: dict[str, float],
    usage: TokenUsage | None,
    token_gaps_ms: Sequence[float] | None,
) -> None:
    """Observe one ended call; a call that counted no tokens is not an LLM call."""
    if usage is None:
        return
    label = str(cold).lower()
    m.prompt_tokens.labels(function).inc(usage.prompt_tokens)
    m.generation_tokens.labels(function).inc(usage.completion_tokens)
    m.e2e_request_latency_s.labels(function, label).observe(max(0.0, latency_s))
    ttft_ms = timings_ms.get("ttft")
    if ttft_ms is not None:
        waited_ms = timings_ms.get("queue_wait", 0.0)
        m.time_to_first_token_s.labels(function, label).observe((waited_ms + ttft_ms) / MS_PER_S)
    if "tpot" in timings_ms:
        m.request_time_per_output_token_s.labels(function).observe(timings_ms["tpot"] / MS_PER_S)
    if "engine_queue" in timings_ms:
        m.request_queue_time_s.labels(function).observe(timings_ms["engine_queue"] / MS_PER_S)
    gaps = m.inter_token_latency_s.labels(function)
    for gap_ms in token_gaps_ms or ():
        gaps.observe(gap_ms / MS_PER_S)
