"""Dynamic batching with real replica processes: batches up to the maximum, within the wait."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from control_plane.protocol import RunCall, StartReplica
from tests.worker.recorder import Recorder
from tests.worker.streamed import streamed
from tests.worker.test_replicas import LocalCodeRuntime
from worker.replicas import ReplicaManager

BUNDLE = "blake3:" + "0" * 64


@pytest.fixture
def setup() -> Iterator[tuple[ReplicaManager, Recorder]]:
    recorder = Recorder()
    runtime = LocalCodeRuntime()
    manager = ReplicaManager(runtime, recorder.client(), None)
    yield manager, recorder
    manager.close()
    manager.stop_all()
    runtime.close()


def start(manager: ReplicaManager, entry: str, max_batch_size: int, max_wait_ms: float) -> None:
    msg = StartReplica(
        replica_id="r1",
        function="f",
        version=1,
        bundle_digest=BUNDLE,
        entry=entry,
        max_batch_size=max_batch_size,
        max_wait_ms=max_wait_ms,
    )
    manager.start_replica(msg)


def run_all(manager: ReplicaManager, calls: list[RunCall]) -> None:
    """Deliver the calls at once, each on its own thread, as the Celery consumer does."""
    threads = [threading.Thread(target=manager.run_call, args=(c,)) for c in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)


def call(call_id: str, input: object, **kw: object) -> RunCall:
    return RunCall(
        call_id=call_id, replica_id="r1", function="f", input=input, accepted_at=time.time(), **kw
    )  # type: ignore[arg-type]


def final(recorder: Recorder, call_id: str) -> dict[str, object]:
    return recorder.events(f"/v1/calls/{call_id}/")[-1]


def test_full_batches_form_without_waiting_and_each_call_gets_its_own_result(
    setup: tuple[ReplicaManager, Recorder],
) -> None:
    manager, recorder = setup
    # A wait far longer than the test: only a full batch can end it early.
    start(manager, "batched:Doubler", max_batch_size=4, max_wait_ms=600_000)
    run_all(manager, [call(f"c{i}", {"x": i}) for i in range(8)])
    sizes = []
    for i in range(8):
        event = final(recorder, f"c{i}")
        assert event["kind"] == "succeeded"
        assert event["output"] == {"y": 2 * i, "seen": 4, "call_id": f"c{i}"}
        assert event["batch_size"] == 4
        sizes.append(event["batch_index"])
        assert {"batch_wait", "execution", "total", "queue_wait"} <= set(event["timings_ms"])
    assert sorted(sizes) == [0, 0, 1, 1, 2, 2, 3, 3]  # two batches of four


def test_a_partial_batch_is_sent_when_the_wait_is_over(
    setup: tuple[ReplicaManager, Recorder],
) -> None:
    manager, recorder = setup
    start(manager, "batched:Doubler", max_batch_size=8, max_wait_ms=200)
    run_all(manager, [call(f"c{i}", {"x": i}) for i in range(3)])
    events = [final(recorder, f"c{i}") for i in range(3)]
    assert all(e["kind"] == "succeeded" for e in events)
    sizes = [e["batch_size"] for e in events]
    assert max(sizes) <= 3  # never more calls than arrived
    # the first call of each batch waited the wait out (no eighth call came)
    firsts = [e for e in events if e["batch_index"] == 0]
    assert all(e["timings_ms"]["batch_wait"] >= 200 for e in firsts)  # type: ignore[index]


def test_one_failed_value_fails_only_its_call(setup: tuple[ReplicaManager, Recorder]) -> None:
    manager, recorder = setup
    start(manager, "batched:Doubler", max_batch_size=3, max_wait_ms=600_000)
    run_all(manager, [call("a", {"x": 1}), call("b", {"x": 2, "fail": True}), call("c", {"x": 3})])
    assert [final(recorder, c)["kind"] for c in "abc"] == ["succeeded", "failed", "succeeded"]
    assert "asked to fail: 2" in str(final(recorder, "b")["error"])


def test_a_wrong_length_fails_every_call_of_the_batch(
    setup: tuple[ReplicaManager, Recorder],
) -> None:
    manager, recorder = setup
    start(manager, "batched:WrongLength", max_batch_size=2, max_wait_ms=600_000)
    run_all(manager, [call("a", 1), call("b", 2)])
    for c in "ab":
        event = final(recorder, c)
        assert event["kind"] == "failed" and "one value per input" in str(event["error"])


def test_streamed_batch_sends_each_call_its_own_chunks(
    setup: tuple[ReplicaManager, Recorder],
) -> None:
    manager, recorder = setup
    start(manager, "batched:Tokens", max_batch_size=2, max_wait_ms=600_000)
    run_all(manager, [call("a", {"n": 3}, stream=True), call("b", {"n": 1})])
    a = recorder.events("/v1/calls/a/")
    assert streamed(a) == (["started", "output", "succeeded"], ["t0", "t1", "t2"])
    assert final(recorder, "b")["output"] == ["t0"]  # a non-streaming caller gets the list


def test_streamed_batch_fails_one_call_and_returns_final_values_to_the_others(
    setup: tuple[ReplicaManager, Recorder],
) -> None:
    manager, recorder = setup
    start(manager, "batched:TokensThenTotals", max_batch_size=3, max_wait_ms=600_000)
    run_all(manager, [call("a", {"n": 2}, stream=True), call("b", {"n": -1}), call("c", {"n": 3})])
    a = recorder.events("/v1/calls/a/")
    assert streamed(a)[0] == ["started", "output", "succeeded"] and len(streamed(a)[1]) == 2
    assert a[-1]["output"] is None  # a streaming caller had its chunks
    assert final(recorder, "b")["kind"] == "failed"
    assert "n must not be negative" in str(final(recorder, "b")["error"])
    assert final(recorder, "c")["output"] == {"tokens": 3}  # the returned value


def test_batching_without_a_batch_method_fails_the_start(
    setup: tuple[ReplicaManager, Recorder],
) -> None:
    manager, recorder = setup
    start(manager, "batched:NoBatchMethod", max_batch_size=2, max_wait_ms=10)
    events = recorder.events("/v1/replicas/r1/")
    assert [e["state"] for e in events] == ["starting", "failed"]
    assert "has no batch(self, inputs) method" in events[1]["error"]
