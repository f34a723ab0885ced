"""A direct-run stream's outputs handed to its reader in memory (``services.live_outputs``):
the reader gets every output in order, the record gets the first at once and the rest
with the end, and a run that stops without its end leaves the reader to the database
from where the hand-off stopped. On a real (SQLite) database, with the direct port's
events scripted."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from control_plane.api.app import build_services
from control_plane.db import migrate
from control_plane.db.models import Call
from control_plane.dispatch.direct import DirectLostError
from control_plane.dispatch.memory import InMemoryDispatcher
from control_plane.protocol import CallEvent, RunCall
from control_plane.services import calls
from control_plane.services.activator import Activator, StreamItem
from control_plane.services.context import Services
from control_plane.services.direct_calls import Claim
from control_plane.services.direct_runner import DirectRunner, joined
from control_plane.services.live_outputs import LiveItem, LiveOutputs
from tests.control_plane.conftest import make_settings

CALL = "c1"


class ScriptedPort:
    """A direct channel whose run gives ``script``'s events (an exception is raised)."""

    def __init__(self, script: list[CallEvent | Exception], before_end: Callable[[], None]):
        self.script = script
        self.before_end = before_end

    def run(self, addr: str, token: str, msg: RunCall, timeout_s: float) -> Iterator[CallEvent]:
        for step in self.script:
            if isinstance(step, Exception):
                self.before_end()
                raise step
            if step.kind == "succeeded":
                self.before_end()
            yield step


@pytest.fixture
def services(tmp_path: Path) -> Iterator[Services]:
    url = f"sqlite:///{tmp_path / 'thaw.db'}"
    migrate.upgrade(url)
    s = build_services(make_settings(tmp_path, url, tmp_path / "store"), InMemoryDispatcher())
    with s.db.session() as session:
        session.add(
            Call(
                id=CALL,
                function="f",
                version=1,
                api_key_id="k",
                input_json="null",
                status="dispatched",
                replica_id="r1",
                accepted_at=s.clock(),
                timeout_s=60,
                deadline_at=s.clock() + 60,
            )
        )
    yield s
    s.db.dispose()


def _claim(s: Services) -> Claim:
    with s.db.session() as session:
        row = calls.get_row(session, CALL)
        session.expunge(row)
    msg = RunCall(call_id=CALL, replica_id="r1", function="f", stream=True, accepted_at=0.0)
    return Claim(CALL, "f", "w1", msg, s.clock() + 60, "127.0.0.1:1", "token", row)


def _stored(s: Services) -> list[tuple[int, Any]]:
    with s.db.session() as session:
        return calls.outputs_after(session, CALL, 1, 0)


def _run(s: Services, script: list[CallEvent | Exception]) -> tuple[list[StreamItem], list[Any]]:
    """Run the call while reading its stream; what the reader got, and what the record
    held just before the run's end."""
    seen_before_end: list[Any] = []
    s.direct = ScriptedPort(script, lambda: seen_before_end.extend(_stored(s)))  # type: ignore[assignment]
    runner = DirectRunner(s, kick=lambda f: None, send_queued=lambda w, m: True)
    s.live.open(CALL)
    runner.start(_claim(s))
    items = list(Activator(s).stream(CALL, keepalive_s=5.0))
    return items, seen_before_end


def out(seq: int, *chunks: str) -> CallEvent:
    return CallEvent(kind="output", seq=seq, outputs=list(chunks))


def test_outputs_come_in_memory_and_are_recorded_with_the_end(services: Services) -> None:
    script: list[CallEvent | Exception] = [
        CallEvent(kind="started"),
        out(1, "a"),
        out(2, "b", "c"),
        out(4, "d"),
        CallEvent(kind="succeeded", output="abcd"),
    ]
    items, before_end = _run(services, script)
    assert [(i.kind, i.data) for i in items] == [
        ("output", "a"),
        ("output", "b"),
        ("output", "c"),
        ("output", "d"),
        ("done", "abcd"),
    ]
    assert before_end == [(1, "a")]  # the first output at once, for its time
    assert _stored(services) == [(1, "a"), (2, "b"), (3, "c"), (4, "d")]
    assert len(services.live) == 0
    with services.db.session() as session:
        view = calls.get(session, CALL)
    assert view.status == "succeeded" and "first_output" in view.timings_ms


def test_a_run_that_stops_without_its_end_leaves_the_rest_to_the_database(
    services: Services,
) -> None:
    def worker_reports_the_rest() -> None:  # the worker's HTTP report, a moment later
        with services.db.session() as session:
            now = services.clock()
            calls.record_event(session, None, now, CALL, out(3, "c"))
            calls.record_event(session, None, now, CALL, CallEvent(kind="succeeded", output=3))
        services.notifier.notify(CALL)

    script: list[CallEvent | Exception] = [out(1, "a"), out(2, "b"), DirectLostError("gone")]
    reporter = threading.Timer(0.3, worker_reports_the_rest)
    reporter.start()
    items, _ = _run(services, script)
    reporter.join()
    assert [(i.kind, i.data) for i in items] == [
        ("output", "a"),
        ("output", "b"),
        ("output", "c"),
        ("done", 3),
    ]
    assert _stored(services) == [(1, "a"), (2, "b"), (3, "c")]


def test_a_second_reader_and_a_reader_after_the_run_read_the_database() -> None:
    live = LiveOutputs()
    live.open("x")
    assert live.attach("x") is not None
    assert live.attach("x") is None  # one reader takes the hand-off
    live.end("x")
    assert live.attach("x") is None and len(live) == 0


def test_the_end_without_a_final_item_is_a_fallback() -> None:
    live = LiveOutputs()
    ended_well, cut_short = live.open("a"), live.open("b")
    ended_well.put(LiveItem("final"))
    live.end("a")
    live.end("b")
    assert ended_well.get(0) == LiveItem("final") and ended_well.get(0) is None
    assert cut_short.get(0) == LiveItem("fallback")


def test_consecutive_outputs_are_joined_into_one_event() -> None:
    events = [out(1, "a"), out(2, "b", "c"), out(5, "e"), out(6, "f")]
    assert [(e.seq, e.chunks()) for e in joined(events)] == [(1, ["a", "b", "c"]), (5, ["e", "f"])]
    assert joined([]) == []
