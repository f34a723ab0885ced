"""A direct-run stream's outputs handed to its reader in memory (``services.live_outputs``):
the reader gets every output in order, the record gets the first once the reader
passed it on (with the time it came) and the rest with the end, and a run that stops
without its end leaves the reader to the database from where the hand-off stopped. On
a real (SQLite) database, with the direct port's events scripted."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from control_plane.api.app import build_services
from control_plane.db import migrate
from control_plane.dispatch.direct import DirectLostError
from control_plane.dispatch.memory import InMemoryDispatcher
from control_plane.protocol import CallEvent, RunCall
from control_plane.services import calls, live_outputs
from control_plane.services.activator import Activator, StreamItem
from control_plane.services.context import Services
from control_plane.services.direct_runner import DirectRunner, joined
from control_plane.services.live_outputs import LiveItem, LiveOutputs
from tests.control_plane.conftest import make_settings
from tests.control_plane.direct_runs import claim_of, dispatched_call

CALL = "c1"


class Pushed:
    """A stream the port pushes on a thread of its own, as the channel's reader does."""

    def __init__(self) -> None:
        self.acked = threading.Event()

    def ack(self) -> None:
        self.acked.set()

    def abandon(self) -> None:
        raise AssertionError("no run here outlives its deadline")


class ScriptedPort:
    """A direct channel whose streams push ``script``'s events, ``pause_s`` apart, as
    tokens come (an exception: the stream is lost)."""

    def __init__(
        self,
        script: list[CallEvent | Exception],
        before_end: Callable[[], None],
        pause_s: float = 0.1,
    ) -> None:
        self.script = script
        self.before_end = before_end
        self.pause_s = pause_s

    def stream(
        self,
        addr: str,
        token: str,
        msg: RunCall,
        on_event: Callable[[CallEvent], None],
        on_lost: Callable[[DirectLostError], None],
    ) -> Pushed:
        def push() -> None:
            for step in self.script:
                time.sleep(self.pause_s)
                if isinstance(step, Exception):
                    self.before_end()
                    on_lost(DirectLostError(str(step)))
                    return
                if step.kind == "succeeded":
                    self.before_end()
                on_event(step)

        threading.Thread(target=push, daemon=True).start()
        return Pushed()


@pytest.fixture
def services(tmp_path: Path) -> Iterator[Services]:
    url = f"sqlite:///{tmp_path / 'thaw.db'}"
    migrate.upgrade(url)
    s = build_services(make_settings(tmp_path, url, tmp_path / "store"), InMemoryDispatcher())
    with s.db.session() as session:
        session.add(dispatched_call(CALL, s.clock()))
    yield s
    s.db.dispose()


def _stored(s: Services) -> list[tuple[int, Any]]:
    with s.db.session() as session:
        return calls.outputs_after(session, CALL, 1, 0)


def _status(s: Services) -> str:
    with s.db.session() as session:
        return calls.get(session, CALL).status


def _start(s: Services, port: object) -> None:
    """Run the call over ``port`` on a thread of its own, its hand-off open."""
    s.direct = port  # type: ignore[assignment]
    runner = DirectRunner(s, kick=lambda f: None, send_queued=lambda w, m: True)
    s.live.open(CALL)
    runner.start(claim_of(s, CALL, stream=True))


def _run(
    s: Services, script: list[CallEvent | Exception], reader: str
) -> tuple[list[StreamItem], list[Any]]:
    """Run the call while reading its stream (on this thread, or in an event loop);
    what the reader got, and what the record held just before the run's end."""
    seen_before_end: list[Any] = []
    _start(s, ScriptedPort(script, lambda: seen_before_end.extend(_stored(s))))
    if reader == "thread":
        items = list(Activator(s).stream(CALL, keepalive_s=5.0))
    else:

        async def read() -> list[StreamItem]:
            return [i async for batch in Activator(s).astream(CALL, 5.0) for i in batch]

        items = asyncio.run(read())
    return items, seen_before_end


READERS = pytest.mark.parametrize("reader", ["thread", "event loop"])


def out(seq: int, *chunks: str) -> CallEvent:
    return CallEvent(kind="output", seq=seq, outputs=list(chunks))


@READERS
def test_outputs_come_in_memory_and_are_recorded_with_the_end(
    services: Services, reader: str
) -> None:
    script: list[CallEvent | Exception] = [
        CallEvent(kind="started"),
        out(1, "a"),
        out(2, "b", "c"),
        out(4, "d"),
        CallEvent(kind="succeeded", output="abcd"),
    ]
    items, before_end = _run(services, script, reader)
    assert [(i.kind, i.data) for i in items] == [
        ("output", "a"),
        ("output", "b"),
        ("output", "c"),
        ("output", "d"),
        ("done", "abcd"),
    ]
    assert before_end == [(1, "a")]  # the first output before the rest, for its time
    assert _stored(services) == [(1, "a"), (2, "b"), (3, "c"), (4, "d")]
    until = time.monotonic() + 5  # the run's thread closes the hand-off after the end
    while len(services.live) and time.monotonic() < until:
        time.sleep(0.01)
    assert len(services.live) == 0
    with services.db.session() as session:
        view = calls.get(session, CALL)
    assert view.status == "succeeded" and "first_output" in view.timings_ms


@READERS
def test_a_run_that_stops_without_its_end_leaves_the_rest_to_the_database(
    services: Services, reader: str
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
    items, _ = _run(services, script, reader)
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


def test_a_reader_in_the_event_loop_gets_what_piled_up_in_one_wake_up() -> None:
    live = LiveOutputs().open("x")
    for seq in (1, 2, 3):
        live.put(LiveItem("output", seq, str(seq)))

    async def read() -> tuple[list[LiveItem], list[LiveItem], list[LiveItem], float]:
        piled = await live.get_ready(5.0)
        started = time.monotonic()
        threading.Timer(0.2, live.put, [LiveItem("final")]).start()
        woken = await live.get_ready(5.0)  # waits, no thread of its own, until the put
        waited_s = time.monotonic() - started
        return piled, woken, await live.get_ready(0.05), waited_s

    piled, woken, none, waited_s = asyncio.run(read())
    assert [i.seq for i in piled] == [1, 2, 3]
    assert woken == [LiveItem("final")] and 0.15 < waited_s < 4.0
    assert none == []  # nothing came within the timeout


def test_a_live_streams_start_is_recorded_with_its_first_output(services: Services) -> None:
    """No write before the first token reaches its reader: until then the record says
    the call was dispatched; with the first output it is running."""
    statuses: list[str] = []
    script = [CallEvent(kind="started"), out(1, "a"), CallEvent(kind="succeeded", output="a")]
    # The record as each event after the start comes: the start read, the first output not yet.
    port = ScriptedPort(script, lambda: None, pause_s=0.3)
    stream = port.stream

    def stream_noting_statuses(*args: Any) -> Pushed:
        on_event = args[3]

        def noting(ev: CallEvent) -> None:
            if ev.kind != "started":
                statuses.append(_status(services))
            on_event(ev)

        return stream(*args[:3], noting, args[4])

    port.stream = stream_noting_statuses  # type: ignore[method-assign]
    _start(services, port)
    items = list(Activator(services).stream(CALL, keepalive_s=5.0))
    assert [i.kind for i in items] == ["output", "done"]
    assert statuses == ["dispatched", "running"]


def test_the_first_output_is_recorded_once_its_reader_passed_it_on(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record waits for the reader (its transaction would hold the interpreter
    while the reader writes the first token), and keeps the time the output came."""
    monkeypatch.setattr(live_outputs, "FIRST_SHOWN_WAIT_S", 30.0)
    script = [CallEvent(kind="started"), out(1, "a"), CallEvent(kind="succeeded", output="a")]
    _start(services, ScriptedPort(list(script), lambda: None))
    reader = Activator(services).stream(CALL, keepalive_s=5.0)
    first = next(reader)
    time.sleep(0.3)  # the reader writing it to its client, slowly
    assert (first.kind, first.data) == ("output", "a")
    assert _status(services) == "dispatched" and _stored(services) == []  # not recorded yet
    passed_on_at = services.clock()
    assert [i.kind for i in reader] == ["done"]  # asks for the next: the first went out
    with services.db.session() as session:
        view = calls.get(session, CALL)
    assert _stored(services) == [(1, "a")]
    assert view.accepted_at + view.timings_ms["first_output"] / 1000 < passed_on_at - 0.25


def test_a_run_waits_for_its_reader_no_longer_than_the_cap_or_its_leaving() -> None:
    live = LiveOutputs().open("x")
    started = time.monotonic()
    assert not live.wait_shown()  # no reader passed anything on: the cap
    waited_s = time.monotonic() - started
    assert live_outputs.FIRST_SHOWN_WAIT_S * 0.9 <= waited_s < 5.0
    live.leave()
    assert live.wait_shown() and not live.wanted
