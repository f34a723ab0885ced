"""Traces of one call from the API to the replica: ``thaw server`` and ``thaw worker``
export over OTLP/HTTP to a real receiver, and the spans form one tree."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest

from tests.e2e.conftest import E2EStore, running_stack
from tests.e2e.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.e2e.stack import wait_for

CHAIN = ("thaw.invoke", "thaw.call", "thaw.worker.run_call", "thaw.execution")


def _by_name(spans: list[ReceivedSpan]) -> dict[str, ReceivedSpan]:
    return {s.name: s for s in spans}


def _complete(receiver: OtlpReceiver, call_id: str) -> dict[str, ReceivedSpan] | None:
    spans = _by_name(receiver.trace(call_id))
    return spans if all(n in spans for n in CHAIN) else None


def _assert_chain(spans: dict[str, ReceivedSpan], call_id: str) -> None:
    invoke, call, run, execution = (spans[n] for n in CHAIN)
    assert invoke.parent_span_id == "" and invoke.service == "thaw-control-plane"
    assert call.parent_span_id == invoke.span_id and call.service == "thaw-control-plane"
    assert run.parent_span_id == call.span_id and run.service == "thaw-worker"
    assert execution.parent_span_id == run.span_id
    assert call.attributes["thaw.call_id"] == call_id
    assert not any(s.error for s in spans.values())
    assert spans["thaw.queue_wait"].parent_span_id == call.span_id
    # Children lie within their parents (times from the same records, not re-measured).
    assert call.start_ns <= run.start_ns <= execution.start_ns <= execution.end_ns
    assert execution.end_ns <= run.end_ns <= call.end_ns


@pytest.mark.slow
def test_one_call_is_one_trace_from_the_api_to_the_replica(
    tmp_path: Path, e2e_store: E2EStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    with OtlpReceiver() as receiver:
        # The stack's processes inherit these; every call is kept (share 1).
        monkeypatch.setenv("THAW_OTLP_ENDPOINT", receiver.endpoint)
        monkeypatch.setenv("THAW_TRACE_SAMPLE_RATIO", "1")
        with running_stack("embedded", tmp_path, e2e_store) as stack:
            spec = {"name": "count", "bundle": e2e_store.bundle, "entry": "app:Count"}
            stack.deploy({**spec, "device": "cpu"})
            call_ids = []
            with stack.client() as c:
                # Cold (through the queue and the broker), then warm (the direct port).
                for _ in range(2):
                    r = c.post("/v1/functions/count/invoke", json={"input": {"n": 1}})
                    assert r.status_code == 200, f"{r.text}\n{stack.logs()}"
                    call_ids.append(r.headers["X-Thaw-Call-Id"])
            cold, warm = (
                wait_for(partial(_complete, receiver, i), f"the spans of call {i}", 30)
                for i in call_ids
            )
    _assert_chain(cold, call_ids[0])
    _assert_chain(warm, call_ids[1])
    assert cold["thaw.call"].attributes["thaw.cold"] is True
    assert warm["thaw.call"].attributes["thaw.cold"] is False and "thaw.cold_start" not in warm
    # The cold call's replica start phases hang under thaw.cold_start.
    start = cold["thaw.cold_start"]
    assert start.parent_span_id == cold["thaw.call"].span_id
    phases = [s for s in receiver.trace(call_ids[0]) if s.name.startswith("thaw.phase.")]
    assert {"thaw.phase.schedule", "thaw.phase.user_setup"} <= {p.name for p in phases}
    assert all(p.parent_span_id == start.span_id for p in phases)
    # The worker's own record of that start: the StartReplica carried the call's trace.
    worker_start = cold["thaw.worker.start_replica"]
    assert worker_start.parent_span_id == cold["thaw.call"].span_id
    assert worker_start.service == "thaw-worker" and worker_start.end_ns <= cold["thaw.call"].end_ns
