"""LLM metrics (``control_plane.metrics_llm``): an ended call's token-level figures,
and each LLM replica's engine load.

An LLM call is one whose replica counted tokens (``usage``); its ``timings_ms``
carry what the replica timed (``ttft``, ``tpot``, ``engine_queue``) and the wait
before it began (``queue_wait``), its final event each inter-token gap. Engine
loads come with the workers' heartbeats (``ReplicaReport.llm``).
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from control_plane.db.models import Replica, Worker
from control_plane.metrics import set_series
from control_plane.metrics_llm import LLMMetrics
from control_plane.protocol import TokenUsage
from control_plane.services import inventory
from control_plane.services.states import LIVE_REPLICA_STATES

MS_PER_S = 1000.0


def ttft_seen_ms(timings_ms: dict[str, float]) -> float | None:
    """Accepted to the first token, as the caller felt it: the wait before the
    replica began the call plus the replica's ``ttft``; None: no token came."""
    if "ttft" not in timings_ms:
        return None
    return timings_ms.get("queue_wait", 0.0) + timings_ms["ttft"]


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
    ttft_ms = ttft_seen_ms(timings_ms)
    if ttft_ms is not None:
        m.time_to_first_token_s.labels(function, label).observe(ttft_ms / MS_PER_S)
    if "tpot" in timings_ms:
        m.request_time_per_output_token_s.labels(function).observe(timings_ms["tpot"] / MS_PER_S)
    if "engine_queue" in timings_ms:
        m.request_queue_time_s.labels(function).observe(timings_ms["engine_queue"] / MS_PER_S)
    gaps = m.inter_token_latency_s.labels(function)
    for gap_ms in token_gaps_ms or ():
        gaps.observe(gap_ms / MS_PER_S)


def refresh_engine_gauges(session: Session, m: LLMMetrics) -> None:
    """Set each live LLM replica's engine gauges from its worker's last heartbeat;
    then drop the series of replicas that are gone."""
    live = dict(
        session.execute(
            select(Replica.id, Replica.function).where(Replica.state.in_(LIVE_REPLICA_STATES))
        ).all()
    )
    running: dict[tuple[str, ...], float] = {}
    waiting: dict[tuple[str, ...], float] = {}
    kv: dict[tuple[str, ...], float] = {}
    peak: dict[tuple[str, ...], float] = {}
    aborted: dict[tuple[str, ...], float] = {}
    captures: dict[tuple[str, ...], float] = {}
    eager: dict[tuple[str, ...], float] = {}
    queries: dict[tuple[str, ...], float] = {}
    hits: dict[tuple[str, ...], float] = {}
    for w in session.scalars(select(Worker).where(Worker.lost.is_(False))):
        for replica_id, stats in inventory.decode(w.inventory_json).engines:
            function = live.get(replica_id)
            if function is None:
                continue
            labels = (function, replica_id)
            running[labels], waiting[labels] = stats.running, stats.waiting
            kv[labels], peak[labels] = stats.kv_cache_usage, stats.peak_running
            aborted[labels] = stats.aborted
            captures[labels], eager[labels] = stats.graph_captures, stats.graph_eager_steps
            queries[labels], hits[labels] = stats.prefix_cache_queries, stats.prefix_cache_hits
    set_series(m.num_requests_running, running)
    set_series(m.num_requests_waiting, waiting)
    set_series(m.kv_cache_usage_perc, kv)
    set_series(m.num_requests_running_max, peak)
    set_series(m.num_requests_aborted, aborted)
    set_series(m.cuda_graph_captures, captures)
    set_series(m.cuda_graph_eager_steps, eager)
    set_series(m.prefix_cache_queries, queries)
    set_series(m.prefix_cache_hits, hits)
