"""ReplicaManager with real replica processes; the control plane is a recorder."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from control_plane.protocol import CallEvent, RunCall, StartReplica, StopReplica
from tests.worker.recorder import Recorder
from tests.worker.streamed import seqs, streamed
from worker.child_protocol import ReplicaSpec
from worker.replicas import ReplicaManager
from worker.runtimes.base import OnExit
from worker.runtimes.process import ProcessReplica, ProcessRuntime

FUNCTIONS = Path(__file__).parent / "functions"
BUNDLE = "blake3:" + "0" * 64


class LocalCodeRuntime(ProcessRuntime):
    """Runs the test functions from their directory instead of a pushed bundle."""

    def start(self, spec: ReplicaSpec, on_exit: OnExit) -> ProcessReplica:
        return super().start(spec.model_copy(update={"bundle_dir": str(FUNCTIONS)}), on_exit)


@pytest.fixture
def setup() -> Iterator[tuple[ReplicaManager, Recorder]]:
    recorder = Recorder(final_call_ids={"already-final"})
    runtime = LocalCodeRuntime()
    manager = ReplicaManager(runtime, recorder.client(), None)
    yield manager, recorder
    manager.close()
    manager.stop_all()
    runtime.close()


def start(manager: ReplicaManager, entry: str, replica_id: str = "r1", **kw: object) -> None:
    manager.start_replica(
        StartReplica(
            replica_id=replica_id,
            function="f",
            version=1,
            bundle_digest=BUNDLE,
            entry=entry,
            **kw,  # type: ignore[arg-type]
        )
    )


def call(call_id: str, input: object, replica_id: str = "r1", **kw: object) -> RunCall:
    return RunCall(
        call_id=call_id,
        replica_id=replica_id,
        function="f",
        input=input,
        accepted_at=time.time() - 0.05,
        **kw,  # type: ignore[arg-type]
    )


def kinds(recorder: Recorder, call_id: str) -> list[str]:
    return [e["kind"] for e in recorder.events(f"/v1/calls/{call_id}/")]


def test_start_reports_starting_then_ready_with_phases(
    setup: tuple[ReplicaManager, Recorder],
) -> None:
    manager, recorder = setup
    start(manager, "basic:Echo")
    events = recorder.events("/v1/replicas/r1/")
    assert [e["state"] for e in events] == ["starting", "ready"]
    assert {"process_start", "imports", "device_init", "user_setup"} <= set(events[1]["phases_ms"])
    assert all(e["v"] == 1 for e in events)
    [report] = manager.reports()
    assert (report.replica_id, report.state, report.outstanding_calls) == ("r1", "ready", 0)


def test_streamed_call_posts_started_outputs_succeeded(
    setup: tuple[ReplicaManager, Recorder],
) -> None:
    manager, recorder = setup
    start(manager, "basic:Stream")
    manager.run_call(call("c1", {"n": 2}, stream=True))
    events = recorder.events("/v1/calls/c1/")
    assert streamed(events) == (["started", "output", "succeeded"], [{"i": 0}, {"i": 1}])
    assert seqs(events) == [1, 2]  # a retried post is stored once
    timings = events[-1]["timings_ms"]
    assert timings["queue_wait"] >= 50 and timings["total"] >= timings["execution"]
    assert timings["queue_wait"] <= timings["first_output"] <= timings["total"]


def test_a_call_that_asks_for_no_started_event_gets_none(
    setup: tuple[ReplicaManager, Recorder],
) -> None:
    manager, recorder = setup
    start(manager, "basic:Stream")
    manager.run_call(call("c1", {"n": 1}, stream=True, report_started=False))
    events = recorder.events("/v1/calls/c1/")
    assert [e["kind"] for e in events] == ["output", "succeeded"]
    assert events[-1]["timings_ms"]["queue_wait"] >= 50  # the final event still has it


def test_a_functions_own_timings_join_the_calls_even_when_it_fails(
    setup: tuple[ReplicaManager, Recorder],
) -> None:
    manager, recorder = setup
    start(manager, "basic:Timed")
    manager.run_call(call("ok", {}))
    manager.run_call(call("bad", {"raise": True}))
    for call_id, kind in (("ok", "succeeded"), ("bad", "failed")):
        final = recorder.events(f"/v1/calls/{call_id}/")[-1]
        assert final["kind"] == kind
        timings = final["timings_ms"]
        assert timings["tokenize"] == 1.5
        assert timings["execution"] < 99999.0  # thaw's own name is not the function's
        assert "Bad-Name" not in timings and "detok" not in timings


def test_a_functions_token_usage_joins_its_end_even_when_it_fails(
    setup: tuple[ReplicaManager, Recorder],
) -> None:
    manager, recorder = setup
    start(manager, "basic:Tokens")
    manager.run_call(call("ok", {"prompt": "a b c"}))
    manager.run_call(call("bad", {"prompt": "a b c", "raise": True}))
    manager.run_call(call("malformed", {"prompt": "a b c", "bad": -3}))
    for call_id, kind in (("ok", "succeeded"), ("bad", "failed")):
        final = recorder.events(f"/v1/calls/{call_id}/")[-1]
        assert final["kind"] == kind
        assert final["usage"] == {"prompt_tokens": 3, "completion_tokens": 3}
    final = recorder.events("/v1/calls/malformed/")[-1]
    assert final["kind"] == "succeeded" and final["usage"] is None  # half a count is none


def test_duplicate_delivery_is_run_once(setup: tuple[ReplicaManager, Recorder]) -> None:
    manager, recorder = setup
    start(manager, "basic:Flaky")
    manager.run_call(call("c1", {}))
    manager.run_call(call("c1", {}))
    assert kinds(recorder, "c1") == ["started", "succeeded"]
    manager.run_call(call("c1", {}, attempt=2))  # a retry is a new attempt
    assert kinds(recorder, "c1") == ["started", "succeeded"] * 2


@pytest.mark.parametrize("cap", [1, 2])
def test_calls_beyond_the_target_concurrency_wait_for_a_slot(
    setup: tuple[ReplicaManager, Recorder], cap: int
) -> None:
    # More calls than the cap arrive at once, as when two control planes each take
    # the replica's last slot: __call__ never runs on more threads than the cap.
    manager, recorder = setup
    start(manager, "basic:Overlap", max_concurrent_calls=cap)
    calls = [call(f"c{i}", {"sleep_s": 0.3}) for i in range(cap + 2)]
    threads = [threading.Thread(target=manager.run_call, args=(c,)) for c in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    ends = [recorder.events(f"/v1/calls/{c.call_id}/")[-1] for c in calls]
    assert [e["kind"] for e in ends] == ["succeeded"] * len(calls)
    assert max(e["output"]["most_at_once"] for e in ends) == cap


def test_409_stops_sending_for_that_call(setup: tuple[ReplicaManager, Recorder]) -> None:
    manager, recorder = setup
    start(manager, "basic:Stream")
    manager.run_call(call("already-final", {"n": 5}, stream=True))
    assert kinds(recorder, "already-final") == ["started"]


def test_call_to_unknown_replica_fails_at_once(setup: tuple[ReplicaManager, Recorder]) -> None:
    manager, recorder = setup
    manager.run_call(call("c1", {}, replica_id="nope"))
    [event] = recorder.events("/v1/calls/c1/")
    assert event["kind"] == "failed" and "not running on this worker" in event["error"]


def test_failing_setup_reports_failed_with_error(setup: tuple[ReplicaManager, Recorder]) -> None:
    manager, recorder = setup
    start(manager, "basic:FailingSetup")
    events = recorder.events("/v1/replicas/r1/")
    assert [e["state"] for e in events] == ["starting", "failed"]
    assert "setup exploded on purpose" in events[1]["error"]
    assert manager.reports() == []


def test_timeout_ends_that_call_and_the_replica_serves_on(
    setup: tuple[ReplicaManager, Recorder],
) -> None:
    manager, recorder = setup
    start(manager, "basic:Flaky")
    manager.run_call(call("c1", {"spin_s": 30}, timeout_s=0.3))
    assert kinds(recorder, "c1") == ["started", "timeout"]
    manager.run_call(call("c2", {}))
    assert kinds(recorder, "c2") == ["started", "succeeded"]
    assert [r.state for r in manager.reports()] == ["ready"]
    assert not [
        e
        for e in recorder.posts
        if e[0].startswith("/v1/replicas/r1/") and e[1]["state"] == "failed"
    ]


def test_a_cancel_stops_the_call_in_its_replica(setup: tuple[ReplicaManager, Recorder]) -> None:
    manager, recorder = setup
    start(manager, "basic:Flaky")
    t = threading.Thread(target=manager.run_call, args=(call("c1", {"spin_s": 600}),))
    t.start()
    recorder.wait_for("/v1/calls/c1/", lambda e: e["kind"] == "started")
    manager.cancel(["c1"])
    t.join(timeout=30)
    assert not t.is_alive()  # stopped in the replica, not left to run its 600 s
    assert kinds(recorder, "c1") == ["started", "cancelled"]
    manager.run_call(call("c2", {}))
    assert kinds(recorder, "c2") == ["started", "succeeded"]


def test_cancel_ends_a_streaming_call_as_cancelled(setup: tuple[ReplicaManager, Recorder]) -> None:
    manager, recorder = setup
    start(manager, "basic:Stream")
    t = threading.Thread(target=manager.run_call, args=(call("c1", {"n": 100000}, stream=True),))
    t.start()
    recorder.wait_for("/v1/calls/c1/", lambda e: e["kind"] == "output")
    manager.cancel(["c1"])
    t.join(timeout=30)
    assert kinds(recorder, "c1")[-1] == "cancelled"
    assert kinds(recorder, "c1").count("cancelled") == 1


def test_stop_reports_stopped_and_later_calls_fail(setup: tuple[ReplicaManager, Recorder]) -> None:
    manager, recorder = setup
    start(manager, "basic:Echo")
    manager.stop_replica(StopReplica(replica_id="r1", reason="idle"))
    assert [e["state"] for e in recorder.events("/v1/replicas/r1/")] == [
        "starting",
        "ready",
        "stopped",
    ]
    manager.run_call(call("c1", {}))
    assert kinds(recorder, "c1") == ["failed"]


class Sink:
    """A direct call's connection: records the events written to it (and on which
    thread); ``broken_after``: chunks it takes before its connection breaks (an output
    event carries every chunk made while the one before it was written)."""

    def __init__(self, broken_after: int | None = None) -> None:
        self.events: list[dict[str, object]] = []
        self.threads: list[str] = []
        self.broken_after = broken_after
        self.got_output = threading.Event()

    def __call__(self, event: CallEvent) -> bool:
        chunks = len(streamed(self.events)[1])
        if self.broken_after is not None and chunks >= self.broken_after:
            return False
        self.events.append(event.model_dump(mode="json"))
        self.threads.append(threading.current_thread().name)
        if event.kind == "output":
            self.got_output.set()
        return True


def test_a_direct_streams_outputs_go_out_from_the_replicas_reader_in_order(
    setup: tuple[ReplicaManager, Recorder],
) -> None:
    """Its thread wakes for the call's end only; nothing goes over HTTP."""
    manager, recorder = setup
    start(manager, "basic:Stream")
    sink = Sink()
    manager.run_direct(call("c1", {"n": 200}, stream=True), sink)
    assert streamed(sink.events) == (
        ["started", "output", "succeeded"],
        [{"i": i} for i in range(200)],
    )
    assert seqs(sink.events) == list(range(1, 201))
    me = threading.current_thread().name
    assert sink.threads[0] == sink.threads[-1] == me  # started and the end
    assert me not in sink.threads[1:-1]  # every output from the reader
    assert recorder.events("/v1/calls/c1/") == []


def test_a_direct_stream_whose_connection_breaks_goes_on_over_http_in_order(
    setup: tuple[ReplicaManager, Recorder],
) -> None:
    manager, recorder = setup
    start(manager, "basic:Stream")
    sink = Sink(broken_after=3)
    manager.run_direct(call("c1", {"n": 200, "gap_s": 0.001}, stream=True), sink)
    posted = recorder.events("/v1/calls/c1/")
    kinds_, chunks = streamed(sink.events + posted)
    assert kinds_ == ["started", "output", "succeeded"]
    assert chunks == [{"i": i} for i in range(200)]  # none lost, none twice
    assert seqs(sink.events + posted) == list(range(1, 201))
    assert posted[-1]["kind"] == "succeeded"


def test_a_cancel_ends_a_relayed_stream_once_and_nothing_follows_its_end(
    setup: tuple[ReplicaManager, Recorder],
) -> None:
    manager, recorder = setup
    start(manager, "basic:Stream")
    sink = Sink()
    msg = call("c1", {"n": 10_000_000}, stream=True)
    t = threading.Thread(target=manager.run_direct, args=(msg, sink))
    t.start()
    assert sink.got_output.wait(30)
    manager.cancel(["c1"])
    t.join(timeout=30)
    assert not t.is_alive()
    time.sleep(0.2)  # outputs still on their way from the replica are dropped
    kinds_ = [e["kind"] for e in sink.events]
    assert kinds_[-1] == "cancelled" and kinds_.count("cancelled") == 1
    assert recorder.events("/v1/calls/c1/") == []
    manager.run_direct(call("c2", {"n": 2}, stream=True), sink2 := Sink())  # serves on
    assert streamed(sink2.events)[1] == [{"i": 0}, {"i": 1}]
