"""Spans on the worker, built from what it reports anyway (pure).

The ``RunCall``'s ``traceparent`` names the call's ``thaw.call`` span on the
control plane; ``thaw.worker.run_call`` continues it (from the message's
arrival to the final event) and ``thaw.execution`` is the replica running
the function (its own measured time, ending with the call). A
``StartReplica`` carries the trace of the call it was started for:
``thaw.worker.start_replica`` holds the phases the worker measured
(``thaw.worker.phase.<name>``, end to end, ending when the replica was
ready). A message without ``traceparent`` (an older control plane, or a
start no call waits for) is not traced.
"""

from __future__ import annotations

from control_plane.protocol import CallEvent, RunCall, StartReplica
from control_plane.tail_sampling import LATENCY_ATTRIBUTE
from control_plane.tracing import (
    AttrValue,
    SpanKind,
    SpanRecord,
    new_span_id,
    parse_traceparent,
    phase_spans,
    phases_s,
)

ERROR_KINDS = frozenset({"failed", "timeout"})


def run_call_spans(
    msg: RunCall, event: CallEvent, started_s: float, ended_s: float
) -> list[SpanRecord]:
    """``thaw.worker.run_call`` and its ``thaw.execution`` child; [] when untraced."""
    parent = parse_traceparent(msg.traceparent)
    if parent is None:
        return []
    trace_id, parent_id = parent
    run_id = new_span_id()
    error = (event.error or event.kind) if event.kind in ERROR_KINDS else None
    attributes: dict[str, AttrValue] = {
        "thaw.call_id": msg.call_id,
        "thaw.function": msg.function,
        "thaw.attempt": msg.attempt,
        "thaw.replica_id": msg.replica_id,
        "thaw.status": event.kind,
        LATENCY_ATTRIBUTE: event.timings_ms.get("total", (ended_s - msg.accepted_at) * 1000),
    }
    run = SpanRecord(
        name="thaw.worker.run_call",
        trace_id=trace_id,
        span_id=run_id,
        parent_span_id=parent_id,
        remote_parent=True,
        start_s=started_s,
        end_s=ended_s,
        attributes=attributes,
        error=error,
        kind=SpanKind.CONSUMER,
    )
    execution_s = max(0.0, event.timings_ms.get("execution", 0.0)) / 1000
    execution = SpanRecord(
        name="thaw.execution",
        trace_id=trace_id,
        span_id=new_span_id(),
        parent_span_id=run_id,
        start_s=max(started_s, ended_s - execution_s),
        end_s=ended_s,
        attributes={"thaw.replica_id": msg.replica_id, "thaw.adapter": msg.adapter or ""},
        error=error,
    )
    return [run, execution]


def start_replica_spans(
    msg: StartReplica, phases_ms: dict[str, float], ready_s: float
) -> list[SpanRecord]:
    """``thaw.worker.start_replica`` and a child per phase; [] when untraced."""
    parent = parse_traceparent(msg.traceparent)
    if parent is None:
        return []
    trace_id, parent_id = parent
    start_id = new_span_id()
    t_s = ready_s - phases_s(phases_ms)
    whole = SpanRecord(
        name="thaw.worker.start_replica",
        trace_id=trace_id,
        span_id=start_id,
        parent_span_id=parent_id,
        remote_parent=True,
        start_s=t_s,
        end_s=ready_s,
        attributes={"thaw.replica_id": msg.replica_id, "thaw.function": msg.function},
        kind=SpanKind.CONSUMER,
    )
    return [whole, *phase_spans(phases_ms, t_s, trace_id, start_id, "thaw.worker.phase.")]
