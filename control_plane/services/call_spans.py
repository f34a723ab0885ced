"""A call's spans on the control plane, built from what it recorded (pure).

``invoke_span`` is the API request (a trace's root); ``call_spans`` the call
from acceptance to its final state with its queue wait, its cold start's
phases and its first output as children. The tree is drawn in
:mod:`control_plane.tracing`.
"""

from __future__ import annotations

from control_plane.services.calls import CallView
from control_plane.tail_sampling import LATENCY_ATTRIBUTE
from control_plane.tracing import (
    SpanKind,
    SpanRecord,
    call_trace_id,
    derived_span_id,
    new_span_id,
    phase_spans,
    phases_s,
)

ERROR_STATES = frozenset({"failed", "timeout", "expired"})


def invoke_span(
    call_id: str, function: str, start_s: float, end_s: float, http_status: int, mode: str
) -> SpanRecord:
    """The HTTP request that accepted (and, when sync or streaming, waited for) a call."""
    return SpanRecord(
        name="thaw.invoke",
        trace_id=call_trace_id(call_id),
        span_id=derived_span_id(call_id, "invoke"),
        start_s=start_s,
        end_s=end_s,
        attributes={
            "thaw.call_id": call_id,
            "thaw.function": function,
            "thaw.invoke.mode": mode,
            "http.response.status_code": http_status,
        },
        error=f"HTTP {http_status}" if http_status >= 500 else None,
        kind=SpanKind.SERVER,
    )


def call_spans(view: CallView) -> list[SpanRecord]:
    """The ``thaw.call`` span of a final call and its children; [] until it is final."""
    if view.finished_at is None:
        return []
    trace_id = call_trace_id(view.id)
    call_id = derived_span_id(view.id, "call")
    total_ms = view.timings_ms.get("total", (view.finished_at - view.accepted_at) * 1000)
    root = SpanRecord(
        name="thaw.call",
        trace_id=trace_id,
        span_id=call_id,
        parent_span_id=derived_span_id(view.id, "invoke"),
        remote_parent=True,
        start_s=view.accepted_at,
        end_s=view.finished_at,
        attributes={
            "thaw.call_id": view.id,
            "thaw.function": view.function,
            "thaw.version": view.version,
            "thaw.status": view.status,
            "thaw.attempt": view.attempt,
            "thaw.cold": view.cold,
            "thaw.replica_id": view.replica_id or "",
            LATENCY_ATTRIBUTE: total_ms,
            **llm_attributes(view),
        },
        error=(view.error or view.status) if view.status in ERROR_STATES else None,
    )

    def child(name: str, start_s: float, duration_ms: float, parent: int = call_id) -> SpanRecord:
        return SpanRecord(
            name=name,
            trace_id=trace_id,
            span_id=new_span_id(),
            parent_span_id=parent,
            start_s=start_s,
            end_s=start_s + max(0.0, duration_ms) / 1000,
        )

    spans = [root]
    if "queue_wait" in view.timings_ms:
        spans.append(child("thaw.queue_wait", view.accepted_at, view.timings_ms["queue_wait"]))
    if "first_output" in view.timings_ms:
        spans.append(child("thaw.first_output", view.accepted_at, view.timings_ms["first_output"]))
    if "ttft" in view.timings_ms:  # an LLM call: accepted to its first token
        to_token_ms = view.timings_ms.get("queue_wait", 0.0) + view.timings_ms["ttft"]
        spans.append(child("thaw.llm.first_token", view.accepted_at, to_token_ms))
    if view.cold and view.phases_ms:
        spans += cold_start_spans(view, trace_id, call_id)
    return spans


LLM_TIMINGS = ("engine_queue", "ttft", "tpot", "itl_p50", "itl_p99")


def llm_attributes(view: CallView) -> dict[str, int | float]:
    """An LLM call's tokens (OpenTelemetry's GenAI names) and token timings."""
    out: dict[str, int | float] = {}
    if view.usage is not None:
        out["gen_ai.usage.input_tokens"] = view.usage.prompt_tokens
        out["gen_ai.usage.output_tokens"] = view.usage.completion_tokens
    for name in LLM_TIMINGS:
        if name in view.timings_ms:
            out[f"thaw.llm.{name}_ms"] = view.timings_ms[name]
    return out


def cold_start_spans(view: CallView, trace_id: int, parent_id: int) -> list[SpanRecord]:
    """The replica start this cold call waited for: its phases end to end from the
    call's acceptance (the first call a start is for is the one that asked for it)."""
    start_id = new_span_id()
    spans = phase_spans(view.phases_ms, view.accepted_at, trace_id, start_id, "thaw.phase.")
    whole = SpanRecord(
        name="thaw.cold_start",
        trace_id=trace_id,
        span_id=start_id,
        parent_span_id=parent_id,
        start_s=view.accepted_at,
        end_s=view.accepted_at + phases_s(view.phases_ms),
        attributes={"thaw.replica_id": view.replica_id or ""},
    )
    return [whole, *spans]
