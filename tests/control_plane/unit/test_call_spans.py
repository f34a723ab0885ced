"""A call's spans built from its records: ids shared across processes, parents, times."""

from __future__ import annotations

from control_plane.protocol import CallEvent, RunCall, StartReplica
from control_plane.services.call_spans import call_spans, invoke_span
from control_plane.services.calls import CallView
from control_plane.tracing import (
    call_trace_id,
    call_traceparent,
    derived_span_id,
    parse_traceparent,
    traceparent,
)
from worker.tracing import run_call_spans, start_replica_spans

CALL_ID = "0123456789abcdef0123456789abcdef"


def _view(**kw: object) -> CallView:
    base: dict[str, object] = dict(
        id=CALL_ID,
        function="echo",
        version=1,
        status="succeeded",
        attempt=1,
        input=None,
        output=None,
        error=None,
        adapter=None,
        stream=True,
        cold=True,
        replica_id="r1",
        phases_ms={"schedule": 100.0, "pool_acquire": 50.0, "user_setup": 250.0},
        timings_ms={"queue_wait": 420.0, "first_output": 600.0, "total": 900.0},
        accepted_at=1000.0,
        deadline_at=1300.0,
        finished_at=1000.9,
    )
    base.update(kw)
    return CallView(**base)  # type: ignore[arg-type]


def test_trace_id_is_the_call_id_and_traceparent_round_trips() -> None:
    assert call_trace_id(CALL_ID) == int(CALL_ID, 16)
    assert call_trace_id("not-hex") == call_trace_id("not-hex") != 0
    header = call_traceparent(CALL_ID)
    assert header == f"00-{CALL_ID}-{derived_span_id(CALL_ID, 'call'):016x}-01"
    assert parse_traceparent(header) == (int(CALL_ID, 16), derived_span_id(CALL_ID, "call"))
    assert parse_traceparent(traceparent(5, 6)) == (5, 6)
    for bad in (None, "", "00-xyz-abc-01", f"00-{'0' * 32}-{'0' * 16}-01", "garbage"):
        assert parse_traceparent(bad) is None


def test_call_spans_hang_under_the_invoke_span_with_recorded_times() -> None:
    root = invoke_span(CALL_ID, "echo", 999.99, 1000.95, 200, "stream")
    spans = {s.name: s for s in call_spans(_view())}
    call = spans["thaw.call"]
    assert call.trace_id == root.trace_id == int(CALL_ID, 16)
    assert (call.parent_span_id, call.remote_parent) == (root.span_id, True)
    assert call.span_id == derived_span_id(CALL_ID, "call")
    assert (call.start_s, call.end_s) == (1000.0, 1000.9)
    assert call.attributes["thaw.latency_ms"] == 900.0 and call.error is None
    assert spans["thaw.queue_wait"].parent_span_id == call.span_id
    assert abs(spans["thaw.queue_wait"].end_s - 1000.42) < 1e-9
    assert abs(spans["thaw.first_output"].end_s - 1000.6) < 1e-9
    start = spans["thaw.cold_start"]
    assert start.parent_span_id == call.span_id
    phases = [s for s in spans.values() if s.name.startswith("thaw.phase.")]
    assert all(p.parent_span_id == start.span_id for p in phases)
    # Phases are laid end to end in the order they happen, from the acceptance.
    ordered = sorted(phases, key=lambda s: s.start_s)
    assert [p.name for p in ordered] == [
        "thaw.phase.schedule",
        "thaw.phase.pool_acquire",
        "thaw.phase.user_setup",
    ]
    assert abs(ordered[1].start_s - 1000.1) < 1e-9 and abs(start.end_s - 1000.4) < 1e-9


def test_failed_call_is_an_error_and_warm_calls_have_no_cold_start() -> None:
    spans = call_spans(_view(status="failed", error="boom", cold=False))
    assert {s.name for s in spans} == {"thaw.call", "thaw.queue_wait", "thaw.first_output"}
    assert next(s for s in spans if s.name == "thaw.call").error == "boom"
    assert call_spans(_view(finished_at=None, status="running")) == []
    assert invoke_span(CALL_ID, "echo", 1.0, 2.0, 504, "sync").error == "HTTP 504"


def test_worker_spans_continue_the_runcall_traceparent() -> None:
    msg = RunCall(
        call_id=CALL_ID,
        replica_id="r1",
        function="echo",
        accepted_at=1000.0,
        traceparent=call_traceparent(CALL_ID),
    )
    event = CallEvent(kind="succeeded", timings_ms={"execution": 300.0, "total": 800.0})
    run, execution = run_call_spans(msg, event, started_s=1000.4, ended_s=1000.8)
    assert run.trace_id == int(CALL_ID, 16)
    assert (run.parent_span_id, run.remote_parent) == (derived_span_id(CALL_ID, "call"), True)
    assert execution.parent_span_id == run.span_id
    assert abs(execution.start_s - 1000.5) < 1e-9 and execution.end_s == 1000.8
    assert run.attributes["thaw.latency_ms"] == 800.0
    failed = CallEvent(kind="timeout", error="too slow")
    assert run_call_spans(msg, failed, 1000.4, 1000.8)[0].error == "too slow"
    untraced = msg.model_copy(update={"traceparent": None})
    assert run_call_spans(untraced, event, 1000.4, 1000.8) == []
    # An older peer's payload without the field still validates.
    old = msg.model_dump(mode="json")
    del old["traceparent"]
    assert RunCall.model_validate(old).traceparent is None


def test_worker_start_spans_end_at_ready_under_the_call_they_were_for() -> None:
    msg = StartReplica(
        replica_id="r1",
        function="echo",
        version=1,
        bundle_digest="b",
        entry="app:Echo",
        traceparent=call_traceparent(CALL_ID),
    )
    phases = {"user_setup": 300.0, "pool_acquire": 100.0, "weights_fetch": 600.0}
    start, *children = start_replica_spans(msg, phases, ready_s=2000.0)
    assert start.name == "thaw.worker.start_replica" and start.remote_parent
    assert start.parent_span_id == derived_span_id(CALL_ID, "call")
    assert (start.start_s, start.end_s) == (1999.0, 2000.0)
    assert [c.name for c in children] == [
        "thaw.worker.phase.pool_acquire",
        "thaw.worker.phase.weights_fetch",
        "thaw.worker.phase.user_setup",
    ]
    assert all(c.parent_span_id == start.span_id for c in children)
    assert abs(children[1].start_s - 1999.1) < 1e-9 and abs(children[-1].end_s - 2000.0) < 1e-9
    assert start_replica_spans(msg.model_copy(update={"traceparent": None}), phases, 1.0) == []


def test_an_llm_call_has_its_tokens_token_timings_and_a_first_token_span() -> None:
    from control_plane.protocol import TokenUsage

    timings = {"queue_wait": 40.0, "ttft": 25.0, "tpot": 3.0, "itl_p99": 9.0, "total": 200.0}
    view = _view(timings_ms=timings, usage=TokenUsage(prompt_tokens=12, completion_tokens=50))
    spans = call_spans(view)
    attrs = spans[0].attributes
    assert attrs["gen_ai.usage.input_tokens"] == 12
    assert attrs["gen_ai.usage.output_tokens"] == 50
    assert (attrs["thaw.llm.ttft_ms"], attrs["thaw.llm.tpot_ms"]) == (25.0, 3.0)
    assert "thaw.llm.itl_p50_ms" not in attrs
    first = next(s for s in spans if s.name == "thaw.llm.first_token")
    assert first.start_s == 1000.0 and round((first.end_s - first.start_s) * 1000, 6) == 65.0
    plain = call_spans(_view())
    assert not any(s.name == "thaw.llm.first_token" for s in plain)
    assert not any(k.startswith(("gen_ai.", "thaw.llm.")) for k in plain[0].attributes)
