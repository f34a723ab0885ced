"""Fast-path accepts that arrive together are taken in one transaction
(``Invocations._accept_batch``): each request still ends in exactly one call of its
own, one request's bad input is its own error, requests with one idempotency key
still make one call, and a batch whose transaction fails is accepted again item by
item, with nothing of it left behind. Through the served API, on SQLite and
PostgreSQL, with the first batch held open so the rest of the burst piles up."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from sqlalchemy import event
from sqlalchemy.exc import OperationalError

from control_plane.services.invocations import MAX_ACCEPTS_AT_ONCE, Invocations
from tests.control_plane.conftest import ControlPlane
from tests.control_plane.direct_runs import HeldBatches


@pytest.fixture
def held(cp: ControlPlane) -> Iterator[Callable[[int], HeldBatches]]:
    inv: Invocations = cp.app.state.invocations
    before = inv._accepts

    def hold(burst: int) -> HeldBatches:
        recorder = HeldBatches(inv._accept_batch, MAX_ACCEPTS_AT_ONCE, burst)
        inv._accepts = recorder.combiner
        return recorder

    yield hold
    inv._accepts = before


def _post(
    cp: ControlPlane, fn: str, body: dict[str, Any], key: str | None = None
) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key else {}
    with cp.client() as c:
        return c.post(f"/v1/functions/{fn}/invoke", json=body, headers=headers)


def _burst(cp: ControlPlane, requests: list[tuple[str, dict[str, Any], str | None]]) -> list[Any]:
    with ThreadPoolExecutor(len(requests)) as pool:
        return list(pool.map(lambda r: _post(cp, *r), requests))


def _warm(cp: ControlPlane) -> None:
    r = _post(cp, "echo", {"input": "warm-up"})  # a replica ready: later calls are fast-path
    assert r.status_code == 200, r.text


def _runs(cp: ControlPlane) -> list[str]:
    return [p["call_id"] for w in cp.workers for t, p in w.received if t == "thaw.run_call"]


def _calls(cp: ControlPlane) -> list[dict[str, Any]]:
    with cp.client() as c:
        r = c.get("/v1/calls", params={"function": "echo", "limit": 100})
        assert r.status_code == 200, r.text
        return list(r.json())


def test_a_burst_is_accepted_in_batches_each_request_its_own_call_and_errors(
    cp: ControlPlane, held: Callable[[int], HeldBatches]
) -> None:
    cp.worker()
    cp.deploy("echo", adapters=[{"name": "fr", "ref": cp.store.adapter_refs[0]}])
    _warm(cp)
    good = [("echo", {"input": {"i": i}}, None) for i in range(12)]
    bad = [
        ("nosuch", {"input": 1}, None),  # no such function
        ("echo", {"input": 2, "adapter": "de"}, None),  # an adapter it does not list
        ("echo", {"input": 3, "adapter": "de"}, None),
    ]
    keyed = [("echo", {"input": "once"}, "order-1")] * 4
    requests = good + bad + keyed
    recorder = held(len(requests) - 1)

    answers = _burst(cp, requests)

    assert max(recorder.sizes) > 1, recorder.sizes  # taken together, not one by one
    assert sum(recorder.sizes) == len(requests)  # and each once
    for (_, body, _), r in zip(good, answers[: len(good)], strict=True):
        assert r.status_code == 200, r.text
        assert r.json()["output"] == {"echo": body["input"], "adapter": None}
    nosuch, de2, de3 = answers[len(good) : len(good) + 3]
    assert nosuch.status_code == 404 and "nosuch" in nosuch.json()["detail"]
    assert de2.status_code == de3.status_code == 400 and "'de'" in de2.json()["detail"]
    keyed_answers = answers[len(good) + 3 :]
    assert all(r.status_code == 200 for r in keyed_answers), [r.text for r in keyed_answers]
    assert len({r.json()["call_id"] for r in keyed_answers}) == 1

    listed = _calls(cp)  # each with its output: its input echoed
    inputs = sorted(str(c["output"]["echo"]) for c in listed)
    expected = [str(b["input"]) for _, b, _ in good] + ["once", "warm-up"]
    assert inputs == sorted(expected)  # one call a request: none lost, none twice
    assert all(c["status"] == "succeeded" for c in listed)
    runs = _runs(cp)
    assert sorted(runs) == sorted(c["call_id"] for c in listed)  # each sent once


def test_a_batch_whose_transaction_fails_is_accepted_again_one_by_one(
    cp: ControlPlane, held: Callable[[int], HeldBatches], monkeypatch: pytest.MonkeyPatch
) -> None:
    cp.worker()
    cp.deploy("echo")
    _warm(cp)
    inv: Invocations = cp.app.state.invocations
    accept_in = inv._accept_in
    failed = threading.Event()
    lock = threading.Lock()
    in_batch = 0

    def flaky(session: Any, item: Any, *, fast: bool) -> Any:
        nonlocal in_batch
        with lock:
            in_batch += 1
            fail = in_batch == 3 and not failed.is_set()  # the second batch's second item
            if fail:
                failed.set()
        out = accept_in(session, item, fast=fast)
        if fail:
            raise OperationalError("INSERT", {}, Exception("the database went away"))
        return out

    monkeypatch.setattr(inv, "_accept_in", flaky)
    requests = [("echo", {"input": {"n": i}}, None) for i in range(8)]
    recorder = held(len(requests) - 1)

    answers = _burst(cp, requests)

    assert failed.is_set() and max(recorder.sizes) >= 3, recorder.sizes
    for (_, body, _), r in zip(requests, answers, strict=True):
        assert r.status_code == 200, r.text
        assert r.json()["output"] == {"echo": body["input"], "adapter": None}
    listed = _calls(cp)
    assert sorted(str(c["output"]["echo"]) for c in listed) == sorted(
        [str(b["input"]) for _, b, _ in requests] + ["warm-up"]
    )  # the rolled-back batch left no call behind, and none ran twice
    assert all(c["status"] == "succeeded" for c in listed)
    assert sorted(_runs(cp)) == sorted(c["call_id"] for c in listed)


def test_a_batch_reads_its_function_once_for_all_its_calls(
    cp: ControlPlane, held: Callable[[int], HeldBatches]
) -> None:
    cp.worker()
    cp.deploy("echo")
    _warm(cp)
    inv: Invocations = cp.app.state.invocations
    reads: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        # the read of the version a call is accepted on (``canary.for_call``); the
        # reconciler reads functions too, on its own thread
        if statement.startswith("SELECT functions.id, functions.created_at, functions.active"):
            reads.append(statement)

    requests = [("echo", {"input": {"n": i}}, None) for i in range(9)]
    recorder = held(len(requests) - 1)
    event.listen(inv.s.db.engine, "before_cursor_execute", seen)
    try:
        answers = _burst(cp, requests)
    finally:
        event.remove(inv.s.db.engine, "before_cursor_execute", seen)

    assert [r.status_code for r in answers] == [200] * len(requests), [r.text for r in answers]
    assert max(recorder.sizes) > 1, recorder.sizes
    assert 1 <= len(reads) <= len(recorder.sizes) < len(requests)  # a read a batch, not a call


def test_a_batch_reads_its_replicas_once_and_fills_each_only_to_its_room(
    cp: ControlPlane, held: Callable[[int], HeldBatches]
) -> None:
    """The calls of a batch are routed on one read of the function's replicas, each
    counting the calls the ones before it dispatched: past the replica's room the rest
    stay queued (and run when it frees), never over it."""
    cp.worker()
    room = 3
    cp.deploy("echo", scaling={"min_replicas": 0, "max_replicas": 1, "target_concurrency": room})
    _warm(cp)
    inv: Invocations = cp.app.state.invocations
    in_batch = threading.local()
    reads: list[int] = []
    claims: list[int] = []
    run_batch = inv._accept_batch

    def observed(items: Any) -> Any:
        in_batch.on = True
        try:
            done = run_batch(items)
        finally:
            in_batch.on = False
        claims.append(sum(1 for d in done if not isinstance(d, BaseException) and d[2]))
        return done

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if getattr(in_batch, "on", False) and statement.startswith(
            "SELECT replicas.id, replicas.state, replicas.version, replicas.adapters_json"
        ):
            reads.append(1)

    requests = [("echo", {"input": {"n": i}}, None) for i in range(8)]
    inv._accept_batch = observed  # type: ignore[method-assign]
    recorder = held(len(requests) - 1)
    event.listen(inv.s.db.engine, "before_cursor_execute", seen)
    try:
        answers = _burst(cp, requests)
    finally:
        event.remove(inv.s.db.engine, "before_cursor_execute", seen)
        del inv._accept_batch

    assert [r.status_code for r in answers] == [200] * len(requests), [r.text for r in answers]
    # The first call was held until the other 7 waited, then taken in one batch: the
    # first may still be in flight then, so the batch had room for 2 or 3, no more.
    assert recorder.sizes[:2] == [1, len(requests) - 1], recorder.sizes
    assert claims[0] == 1 and room - 1 <= claims[1] <= room, claims
    assert len(reads) == len(recorder.sizes)  # a read a batch, not a call
