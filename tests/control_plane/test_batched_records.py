"""Events of direct runs recorded at the same time (a burst's starts, first outputs
and ends) are recorded in one transaction (``DirectRunner._record_batch``): each call
still ends once, with its own output; a record for a call that had already ended is
refused alone (the first end stands) without costing the batch's other calls; a
batch whose transaction fails is recorded again record by record. On SQLite and
PostgreSQL, over a direct port whose events are scripted, with the first batch held
open so the rest of the burst piles up."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError

from control_plane.api.app import build_services
from control_plane.db import migrate
from control_plane.dispatch.memory import InMemoryDispatcher
from control_plane.protocol import CallEvent, RunCall
from control_plane.services import calls
from control_plane.services.context import Services
from control_plane.services.direct_runner import MAX_RECORDS_AT_ONCE, DirectRunner
from tests.control_plane.conftest import make_settings
from tests.control_plane.direct_runs import HeldBatches, claim_of, dispatched_call

BURST = 10


class EchoPort:
    """A direct port whose runs start, then succeed with their call's id."""

    def run(self, addr: str, token: str, msg: RunCall, timeout_s: float) -> Iterator[CallEvent]:
        yield CallEvent(kind="started")
        yield CallEvent(kind="succeeded", output={"echo": msg.call_id})


@pytest.fixture
def services(tmp_path: Path, db_url: str) -> Iterator[Services]:
    migrate.upgrade(db_url)
    s = build_services(make_settings(tmp_path, db_url, tmp_path / "store"), InMemoryDispatcher())
    s.direct = EchoPort()  # type: ignore[assignment]
    with s.db.session() as session:
        for i in range(BURST + 1):
            session.add(dispatched_call(f"c{i}", s.clock()))
    yield s
    s.db.dispose()


@pytest.fixture
def runner(services: Services) -> DirectRunner:
    return DirectRunner(services, kick=lambda f: None, send_queued=lambda w, m: True)


def hold(runner: DirectRunner, burst: int) -> HeldBatches:
    recorder = HeldBatches(runner._record_batch, MAX_RECORDS_AT_ONCE, burst)
    runner._records = recorder.combiner
    return recorder


def _ended(s: Services) -> dict[str, Any]:
    with s.db.session() as session:
        views = [calls.get(session, f"c{i}") for i in range(BURST + 1)]
    assert all(v.status == "succeeded" for v in views), [v.status for v in views]
    return {v.id: v.output for v in views}


def _burst(runner: DirectRunner, ids: list[str], *extra: Callable[[], object]) -> list[Any]:
    s = runner.s
    with ThreadPoolExecutor(len(ids) + len(extra)) as pool:
        others = [pool.submit(f) for f in extra]
        views = list(pool.map(lambda c: runner.run(claim_of(s, c), record_started=True), ids))
        for f in others:
            f.result()
    return views


def test_a_bursts_records_are_made_together_each_call_once_a_late_end_refused_alone(
    services: Services, runner: DirectRunner
) -> None:
    first = runner.run(claim_of(services, "c0"))  # ended before the burst
    assert first is not None and first.status == "succeeded"
    ids = [f"c{i}" for i in range(1, BURST + 1)]
    recorder = hold(runner, BURST)  # the starts and the late end behind the first
    late: list[Any] = []

    def late_end() -> None:  # a second end for a call that ended: refused
        ev = CallEvent(kind="failed", error="a late end")
        late.append(runner._record_events("f", "c0", [ev], None))

    views = _burst(runner, ids, late_end)

    assert max(recorder.sizes) > 1, recorder.sizes  # made together, not one by one
    assert sum(recorder.sizes) == 2 * BURST + 1  # and each once
    assert late == [None]
    assert [v.output for v in views] == [{"echo": c} for c in ids]  # each its own end
    assert _ended(services) == {f"c{i}": {"echo": f"c{i}"} for i in range(BURST + 1)}


def test_a_batch_of_records_whose_transaction_fails_is_made_again_one_by_one(
    services: Services, runner: DirectRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    record_in = runner._record_in
    failed = threading.Event()
    lock = threading.Lock()
    made = 0

    def flaky(session: Any, item: Any) -> Any:
        nonlocal made
        with lock:
            made += 1
            fail = made == 3 and not failed.is_set()  # a batch's item after others
            if fail:
                failed.set()
        out = record_in(session, item)
        if fail:
            raise OperationalError("UPDATE", {}, Exception("the database went away"))
        return out

    monkeypatch.setattr(runner, "_record_in", flaky)
    ids = [f"c{i}" for i in range(BURST + 1)]
    recorder = hold(runner, len(ids) - 1)  # the starts behind the first

    views = _burst(runner, ids)

    assert failed.is_set() and max(recorder.sizes) >= 3, recorder.sizes
    assert [v.output for v in views] == [{"echo": c} for c in ids]
    assert _ended(services) == {c: {"echo": c} for c in ids}  # each recorded, once


def test_a_call_that_ended_while_its_first_output_was_on_its_way_stays_ended(
    services: Services, runner: DirectRunner
) -> None:
    claim = claim_of(services, "c1")  # its row as dispatched, kept by the run
    with services.db.session() as session:  # its client left: cancelled meanwhile
        calls.cancel(session, services.metrics, services.clock(), "c1")
    first = [CallEvent(kind="started"), CallEvent(kind="output", seq=1, outputs=["a"])]

    runner._record_events("f", "c1", first, claim.row)  # the first output, recorded late
    end = CallEvent(kind="succeeded", output={"echo": "c1"})
    late_end = runner._record_events("f", "c1", [end], claim.row)  # as the run records it

    assert late_end is None  # the first end stands
    with services.db.session() as session:
        view = calls.get(session, "c1")
    assert view.status == "cancelled" and view.output is None, view
