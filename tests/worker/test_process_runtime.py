"""The process runtime against real replica processes (no control plane)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.worker.streamed import streamed
from worker.child_protocol import ReplicaSpec
from worker.pool import ProcessPool
from worker.runtimes.base import CallRequest, CallUpdate, ReplicaStartError
from worker.runtimes.process import ProcessReplica, ProcessRuntime

FUNCTIONS = Path(__file__).parent / "functions"


class Exits:
    """Records on_exit calls, and lets a test wait for one."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.event = threading.Event()

    def __call__(self, replica_id: str, reason: str) -> None:
        self.calls.append((replica_id, reason))
        self.event.set()


@pytest.fixture(params=["spawned", "forked"])
def runtime(request: pytest.FixtureRequest) -> Iterator[ProcessRuntime]:
    """Replica processes spawned afresh, or forked from a zygote: they behave alike."""
    rt = ProcessRuntime(ProcessPool(zygote=request.param == "forked"))
    yield rt
    rt.close()


def spec(entry: str, replica_id: str = "r1", **kw: Any) -> ReplicaSpec:
    return ReplicaSpec(
        replica_id=replica_id, function="f", entry=entry, bundle_dir=str(FUNCTIONS), **kw
    )


def run(replica: ProcessReplica, call_id: str, input: object, **kw: object) -> list[CallUpdate]:
    return list(replica.call(CallRequest(call_id=call_id, input=input, **kw)))  # type: ignore[arg-type]


@pytest.fixture
def flaky(runtime: ProcessRuntime) -> Iterator[tuple[ProcessReplica, Exits]]:
    exits = Exits()
    replica = runtime.start(spec("basic:Flaky"), exits)
    yield replica, exits
    replica.stop()


def test_start_reports_generic_and_specialize_phases(runtime: ProcessRuntime) -> None:
    exits = Exits()
    replica = runtime.start(spec("basic:Echo", env={"THAW_TEST_ENV": "yes"}), exits)
    try:
        for phase in ("process_start", "imports", "device_init", "user_setup"):
            assert replica.phases_ms[phase] >= 0.0
        assert replica.phases_ms["imports"] > 0.0  # torch was imported in the child
        [update] = run(replica, "c1", {"x": 1}, adapter="a1")
        assert update.kind == "succeeded"
        assert update.output == {
            "input": {"x": 1},
            "device": "cpu",
            "adapter": "a1",
            "call_id": "c1",
            "stream": False,
            "setup_calls": 1,
            "env": "yes",
        }
        assert "execution" in update.timings_ms
    finally:
        replica.stop()
    assert not replica.alive
    assert exits.calls == []  # a requested stop is not an unexpected exit


def test_streaming_yields_each_chunk_then_succeeds(runtime: ProcessRuntime) -> None:
    replica = runtime.start(spec("basic:Stream"), Exits())
    try:
        updates = run(replica, "c1", {"n": 3}, stream=True)
        [collected] = run(replica, "c2", {"n": 3}, stream=False)
    finally:
        replica.stop()
    assert streamed(updates) == (["output", "succeeded"], [{"i": 0}, {"i": 1}, {"i": 2}])
    assert updates[-1].output is None
    assert updates[-1].timings_ms["first_output"] <= updates[-1].timings_ms["execution"]
    # A caller that does not stream gets the chunks as one list.
    assert (collected.kind, collected.output) == ("succeeded", [{"i": 0}, {"i": 1}, {"i": 2}])


class Relayed:
    """A relay that takes ``limit`` chunks at most, then leaves the rest to the call.
    ``first_pause_s``: its first hand-over takes that long, so the frames written
    meanwhile wait in the pipe and the next read takes several (on a busy machine a
    reader that keeps up reads them one by one)."""

    def __init__(
        self, limit: int = 1 << 30, fail: bool = False, first_pause_s: float = 0.0
    ) -> None:
        self.limit = limit
        self.fail = fail
        self.first_pause_s = first_pause_s
        self.chunks: list[Any] = []
        self.handed: list[int] = []  # chunks per hand-over
        self.threads: set[str] = set()

    def __call__(self, chunks: list[Any]) -> int:
        if self.fail:
            raise RuntimeError("a bug in the relay")
        self.threads.add(threading.current_thread().name)
        if not self.handed:
            time.sleep(self.first_pause_s)
        self.handed.append(len(chunks))
        taken = chunks[: max(0, self.limit - len(self.chunks))]
        self.chunks += taken
        return len(taken)


def test_a_relay_takes_the_streamed_chunks_and_the_call_yields_only_its_end(
    runtime: ProcessRuntime,
) -> None:
    replica = runtime.start(spec("basic:Stream"), Exits())
    relay = Relayed(first_pause_s=0.2)
    try:
        updates = run(replica, "c1", {"n": 300}, stream=True, relay=relay)
        after = run(replica, "c2", {"n": 2}, stream=True)  # no relay: yielded as before
    finally:
        replica.stop()
    assert [u.kind for u in updates] == ["succeeded"]
    assert relay.chunks == [{"i": i} for i in range(300)]
    assert threading.current_thread().name not in relay.threads  # the replica's reader
    assert max(relay.handed) > 1  # frames read together are handed over together
    assert streamed(after) == (["output", "succeeded"], [{"i": 0}, {"i": 1}])


@pytest.mark.parametrize("fail", [False, True], ids=["some", "bug"])
def test_what_a_relay_does_not_take_the_call_yields_in_order(
    runtime: ProcessRuntime, fail: bool
) -> None:
    """Fewer chunks taken than handed (or a relay that raises): the rest, and every
    chunk after them, come from the call itself; none is lost or doubled."""
    relay = Relayed(limit=7, fail=fail)
    replica = runtime.start(spec("basic:Stream"), Exits())
    try:
        updates = run(replica, "c1", {"n": 300}, stream=True, relay=relay)
    finally:
        replica.stop()
    kinds, yielded = streamed(updates)
    assert kinds == ["output", "succeeded"]
    assert relay.chunks + yielded == [{"i": i} for i in range(300)]
    assert len(relay.chunks) == (0 if relay.fail else 7)
    assert sum(relay.handed) <= 7 + max(relay.handed, default=0)  # not asked again after


def test_a_streamed_chunk_is_json_or_fails_the_call(runtime: ProcessRuntime) -> None:
    """NaN and infinities go out as null; a chunk that is not JSON fails the call,
    after the chunks before it went out."""
    replica = runtime.start(spec("basic:Stream"), Exits())
    try:
        odd_floats = run(replica, "c1", {"n": 1, "odd": "nan"}, stream=True)
        not_json = run(replica, "c2", {"n": 1, "odd": "set"}, stream=True)
    finally:
        replica.stop()
    assert streamed(odd_floats) == (["output", "succeeded"], [{"i": 0}, {"x": None, "y": None}])
    assert streamed(not_json) == (["output", "failed"], [{"i": 0}])
    assert "not JSON" in (not_json[-1].error or "")


def test_raise_fails_the_call_with_traceback_and_keeps_the_replica(
    flaky: tuple[ProcessReplica, Exits],
) -> None:
    replica, exits = flaky
    [failed] = run(replica, "c1", {"raise": "boom"})
    assert failed.kind == "failed"
    assert failed.error is not None
    assert failed.error.startswith("ValueError: asked to fail: boom")
    assert "basic.py" in failed.error  # the traceback tail names the user's file
    [ok] = run(replica, "c2", {})
    assert (ok.kind, ok.output) == ("succeeded", "ok")
    assert replica.alive and exits.calls == []


def test_non_json_result_fails_the_call(flaky: tuple[ProcessReplica, Exits]) -> None:
    replica, _ = flaky
    [failed] = run(replica, "c1", {"not_json": True})
    assert failed.kind == "failed" and "not JSON" in (failed.error or "")


def test_timeout_cancels_that_call_only_and_the_replica_serves_on(
    flaky: tuple[ProcessReplica, Exits],
) -> None:
    replica, exits = flaky
    other: list[CallUpdate] = []
    slow = threading.Thread(target=lambda: other.extend(run(replica, "c0", {"sleep_s": 2})))
    slow.start()
    [timed_out] = run(replica, "c1", {"spin_s": 600}, timeout_s=0.5)
    slow.join(timeout=30)
    assert timed_out.kind == "timeout" and "0.5 s timeout" in (timed_out.error or "")
    assert "serves on" in (timed_out.error or "")
    assert [(u.kind, u.output) for u in other] == [("succeeded", "ok")]
    [after] = run(replica, "c2", {})
    assert (after.kind, after.output) == ("succeeded", "ok")
    # The cancelled call's thread stopped (its slot is free), and nothing died.
    assert wait_until(lambda: replica.outstanding_calls == 0)
    assert replica.alive and exits.calls == []


def test_a_replica_that_stops_answering_is_killed_and_its_calls_fail_as_its_fault() -> None:
    runtime = ProcessRuntime(ProcessPool(), answer_timeout_s=1.0)
    exits = Exits()
    replica = runtime.start(spec("basic:Flaky"), exits)
    try:
        other: list[CallUpdate] = []
        slow = threading.Thread(target=lambda: other.extend(run(replica, "c0", {"sleep_s": 60})))
        slow.start()
        [timed_out] = run(replica, "c1", {"hold_gil": True}, timeout_s=0.5)
        slow.join(timeout=30)
        assert timed_out.kind == "timeout"
        [died] = other
        assert (died.kind, died.fault, died.not_run) == ("failed", "replica", False)
        assert "stopped answering" in (died.error or "")
        assert exits.event.wait(10) and "stopped answering" in exits.calls[0][1]
        assert process_gone(replica)
    finally:
        replica.stop()
        runtime.close()


def test_calls_waiting_for_a_slot_when_the_replica_dies_were_not_run(
    runtime: ProcessRuntime,
) -> None:
    exits = Exits()
    replica = runtime.start(spec("basic:Flaky", max_concurrent_calls=1), exits)
    try:
        ran: list[CallUpdate] = []
        waited: list[CallUpdate] = []
        first = threading.Thread(target=lambda: ran.extend(run(replica, "c0", {"sleep_s": 60})))
        first.start()
        assert wait_until(lambda: replica.outstanding_calls == 1)
        second = threading.Thread(target=lambda: waited.extend(run(replica, "c1", {})))
        second.start()
        replica.kill("killed by the test")
        first.join(timeout=30)
        second.join(timeout=30)
        assert [(u.kind, u.fault, u.not_run) for u in ran] == [("failed", "replica", False)]
        assert [(u.kind, u.fault, u.not_run) for u in waited] == [("failed", "replica", True)]
    finally:
        replica.stop()


def wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def test_death_is_reported_once_and_fails_the_call(flaky: tuple[ProcessReplica, Exits]) -> None:
    replica, exits = flaky
    [failed] = run(replica, "c1", {"exit": True})
    assert failed.kind == "failed" and "exited with code 3" in (failed.error or "")
    assert exits.event.wait(10)
    assert len(exits.calls) == 1 and "code 3" in exits.calls[0][1]
    [refused] = run(replica, "c2", {})
    assert refused.kind == "failed" and "not running" in (refused.error or "")


@pytest.mark.parametrize("how", ["in the call", "in engine_stats"])
def test_a_replica_lost_fails_its_call_and_exits_the_replica(
    runtime: ProcessRuntime, how: str
) -> None:
    """``sdk.ReplicaLost``: the call that raises it fails with its message, then the
    process exits (75), so the worker reports the replica gone; raised by an engine's
    stats read, the replica exits with no call failing."""
    exits = Exits()
    replica = runtime.start(spec("basic:Lost"), exits)
    try:
        [ok] = run(replica, "c1", {})
        assert (ok.kind, ok.output) == ("succeeded", "ok")
        if how == "in the call":
            [failed] = run(replica, "c2", {"lose": True})
            assert failed.kind == "failed"
            assert (failed.error or "").startswith("ReplicaLost: the device is gone")
        else:
            [ok] = run(replica, "c2", {"later": True})
            assert ok.kind == "succeeded"
        assert exits.event.wait(10)
        assert len(exits.calls) == 1 and "code 75" in exits.calls[0][1]
    finally:
        replica.stop()


def test_failing_setup_raises_start_error_and_leaves_nothing(runtime: ProcessRuntime) -> None:
    with pytest.raises(ReplicaStartError) as info:
        runtime.start(spec("basic:FailingSetup"), Exits())
    assert "setup exploded on purpose" in str(info.value)
    assert "user_setup" in info.value.phases_ms


@pytest.mark.parametrize(
    ("entry", "message"),
    [("basic:Missing", "has no 'Missing'"), ("nomodule:X", "No module"), ("bad", "module:Class")],
)
def test_bad_entry_is_a_clear_start_error(
    runtime: ProcessRuntime, entry: str, message: str
) -> None:
    with pytest.raises(ReplicaStartError, match=message):
        runtime.start(spec(entry), Exits())


def process_gone(replica: ProcessReplica) -> bool:
    return replica.process.proc.poll() is not None
