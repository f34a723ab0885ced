"""The child's engine reporter: sends an LLM replica's engine load when it changes
and at least every resend interval; a read that races the engine is skipped."""

from __future__ import annotations

from typing import Any

from control_plane.protocol import EngineStats
from worker.child_protocol import FROM_CHILD, EngineReport
from worker.engine_report import EngineReporter, reporter_for


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_sends_on_change_and_when_due_only() -> None:
    sent: list[dict[str, Any]] = []
    reads: list[EngineStats | BaseException] = [
        EngineStats(running=1),
        EngineStats(running=1),
        EngineStats(running=2, kv_cache_usage=0.5),
        RuntimeError("dictionary changed size during iteration"),
        EngineStats(running=2, kv_cache_usage=0.5),
    ]

    def source() -> EngineStats:
        read = reads.pop(0)
        if isinstance(read, BaseException):
            raise read
        return read

    clock = Clock()
    reporter = EngineReporter(source, sent.append, resend_s=1.0, clock=clock)
    assert reporter.tick()  # the first
    clock.now = 0.5
    assert not reporter.tick()  # unchanged, not due
    assert reporter.tick()  # changed
    assert not reporter.tick()  # the read raced the engine: skipped
    clock.now = 2.0
    assert reporter.tick()  # unchanged but due
    messages = [FROM_CHILD.validate_python(m) for m in sent]
    assert all(isinstance(m, EngineReport) for m in messages)
    assert [m.stats.running for m in messages] == [1, 2, 2]  # type: ignore[union-attr]


def test_only_a_function_with_engine_stats_gets_a_reporter() -> None:
    class Plain:
        def __call__(self, x: Any) -> Any:
            return x

    class WithEngine:
        def engine_stats(self) -> EngineStats:
            return EngineStats()

    assert reporter_for(Plain(), lambda m: None) is None
    reporter = reporter_for(WithEngine(), lambda m: None)
    assert reporter is not None
    reporter.stop()


def test_an_engine_that_cannot_run_again_ends_the_replica_through_on_lost() -> None:
    """``sdk.ReplicaLost`` is a RuntimeError, but not a read that raced the engine:
    it goes to ``on_lost`` (the replica exits) and the reporter stops."""
    import threading

    from worker.sdk import ReplicaLost

    lost: list[ReplicaLost] = []
    called = threading.Event()

    def source() -> EngineStats:
        raise ReplicaLost("the engine could not start again")

    def on_lost(exc: ReplicaLost) -> None:
        lost.append(exc)
        called.set()

    reporter = EngineReporter(source, lambda m: None, poll_s=0.01, on_lost=on_lost)
    reporter.start()
    assert called.wait(5)
    reporter._thread.join(5)
    assert not reporter._thread.is_alive()
    assert [str(e) for e in lost] == ["the engine could not start again"]
