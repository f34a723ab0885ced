"""Where a cold start's time went: the phases the control plane measures itself,
and the Prometheus observations of every phase and call timing.

The worker reports the phases between receiving ``StartReplica`` and the
replica being ready (pool acquire … user setup). The control plane adds the
three it alone can see, so that for a cold call the phases add up to what
the caller waited::

    accepted ─ schedule ─▶ sent ─ transit + worker phases ─▶ ready ─ first_output ─▶ first output
    (or the decision to start,
     for warm-ups and min_replicas)

``sent`` is the StartReplica's dispatch. ``schedule`` = ``dispatched_at -
requested_at`` of the replica, where ``requested_at`` is the oldest waiting
call's acceptance (or the decision time when no call waits). ``first_output``
= the call's first output (its end, for a call that does not stream) minus the
replica's ``ready_at``. ``transit`` = what the worker's phases leave of
``ready_at - dispatched_at``: the StartReplica's trip to the worker (its broker
or HTTP hop) and the ready event's trip back. The two clocks are different
machines', so the trips are one residual, not two measured spans.
"""

from __future__ import annotations

import json

from control_plane.db.models import Call, Replica
from control_plane.metrics import Metrics


def schedule_ms(requested_at: float | None, dispatched_at: float | None) -> float | None:
    """The schedule phase, or None until the start was sent."""
    if requested_at is None or dispatched_at is None:
        return None
    return max(0.0, dispatched_at - requested_at) * 1000


#: Phases the control plane measures; every other one is the worker's.
_OWN_PHASES = frozenset({"schedule", "transit", "first_output"})


def transit_ms(
    dispatched_at: float | None, ready_at: float | None, worker_phases: dict[str, float]
) -> float | None:
    """The transit phase, or None until the replica is ready."""
    if dispatched_at is None or ready_at is None:
        return None
    worker_ms = sum(max(0.0, ms) for name, ms in worker_phases.items() if name not in _OWN_PHASES)
    return max(0.0, (ready_at - dispatched_at) * 1000 - worker_ms)


def replica_phases(row: Replica) -> dict[str, float]:
    """The replica's phases: the worker's, with ``schedule`` and ``transit`` as the
    control plane measured them."""
    phases: dict[str, float] = json.loads(row.phases_json)
    measured = schedule_ms(row.requested_at, row.dispatched_at)
    if measured is not None:
        phases["schedule"] = measured
    transit = transit_ms(row.dispatched_at, row.ready_at, phases)
    if transit is not None:
        phases["transit"] = transit
    return phases


def first_output_ms(ready_at: float | None, first_at: float | None) -> float | None:
    if ready_at is None or first_at is None:
        return None
    return max(0.0, first_at - ready_at) * 1000


def complete_cold_call(metrics: Metrics | None, call: Call, replica: Replica | None) -> None:
    """Add ``first_output`` to a cold call's phases (once); the replica's first
    call to get there also records it on the replica and in the histogram."""
    if not call.cold or replica is None:
        return
    phases = json.loads(call.phases_json)
    if "first_output" in phases:
        return
    first = first_output_ms(replica.ready_at, call.first_output_at or call.finished_at)
    if first is None:
        return
    call.phases_json = json.dumps({**phases, "first_output": first})
    replica_phases_stored = json.loads(replica.phases_json)
    if "first_output" not in replica_phases_stored:
        replica.phases_json = json.dumps({**replica_phases_stored, "first_output": first})
        if metrics is not None:
            metrics.cold_start_phase_s.labels(call.function, "first_output").observe(first / 1000)


def observe_start(metrics: Metrics | None, row: Replica) -> None:
    """Observe every phase known when a replica becomes ready (``first_output`` comes later)."""
    if metrics is None:
        return
    for phase, ms in replica_phases(row).items():
        metrics.cold_start_phase_s.labels(row.function, phase).observe(max(0.0, ms) / 1000)


def observe_call(
    metrics: Metrics | None,
    function: str,
    cold: bool,
    timings_ms: dict[str, float],
    adapter: str | None,
    adapter_hit: bool | None,
) -> None:
    """Observe a finished call's timings, and its adapter hit or miss when reported."""
    if metrics is None:
        return
    label = str(cold).lower()
    for timing, ms in timings_ms.items():
        metrics.call_timing_s.labels(function, timing, label).observe(max(0.0, ms) / 1000)
    if adapter_hit is not None and adapter is not None:
        counter = metrics.adapter_hits if adapter_hit else metrics.adapter_misses
        counter.labels(function).inc()
