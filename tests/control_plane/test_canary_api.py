"""Canary versions through the served API with a fake worker: the split, replicas of
both versions, status side by side, promote and abort."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest

from control_plane.services.states import FINAL_CALL_STATES as FINAL
from tests.control_plane.conftest import ControlPlane
from tests.control_plane.fake_worker import FakeWorker

N_CALLS = 40


@pytest.fixture
def cp(cp_factory: Callable[..., ControlPlane]) -> ControlPlane:
    # Lost after 3 s without a heartbeat, not 0.6 s: these tests make many calls, and a
    # loaded CI machine can starve the fake worker's heartbeat thread that long.
    return cp_factory(heartbeat_interval_s=1.0)


ASYNC = {"Prefer": "respond-async"}


def _wait(c: httpx.Client, call_id: str) -> dict:
    deadline = time.monotonic() + 60
    while (body := c.get(f"/v1/calls/{call_id}").json())["status"] not in FINAL:
        assert time.monotonic() < deadline, body
        time.sleep(0.02)
    return dict(body)


def _finish_all(c: httpx.Client, n: int) -> list[dict]:
    """Invoke ``n`` calls asynchronously, then wait for each; their final records."""
    ids = []
    for i in range(n):
        r = c.post(
            "/v1/functions/echo/invoke", json={"input": i}, headers={"Prefer": "respond-async"}
        )
        assert r.status_code == 202, r.text
        ids.append(r.json()["call_id"])
    records = [_wait(c, call_id) for call_id in ids]
    for body in records:
        assert body["status"] == "succeeded", (body["error"], body)
    return records


def test_canary_takes_its_share_status_shows_both_then_promote(cp: ControlPlane) -> None:
    worker = cp.worker()
    cp.deploy("echo")
    with cp.client() as c:
        r = c.post("/v1/functions", params={"canary_pct": 30}, json=cp.spec("echo", timeout_s=11))
        assert r.status_code == 201, r.text
        assert r.json()["version"] == 1 and r.json()["versions"] == [1, 2]  # 1 stays active
        assert r.json()["canary"]["version"] == 2 and r.json()["canary"]["weight_pct"] == 30

        records = _finish_all(c, N_CALLS)
        by_version = {v: sum(r["version"] == v for r in records) for v in (1, 2)}
        assert by_version[1] > 0 and by_version[2] > 0, by_version  # P(fail) < 1e-6
        started = {p["version"] for t, p in worker.received if t == "thaw.start_replica"}
        assert started == {1, 2}  # replicas of both versions ran at once

        status = c.get("/v1/functions/echo/canary").json()
        assert status["weight_pct"] == 30
        assert (status["active"]["version"], status["canary"]["version"]) == (1, 2)
        assert status["active"]["calls"] == by_version[1]
        assert status["canary"]["calls"] == by_version[2]
        for side in ("active", "canary"):
            s = status[side]
            assert s["error_rate"] == 0 and 0 < s["cold_start_rate"] <= 1
            assert s["latency"]["count"] == s["calls"]
            assert s["latency"]["p50_ms"] <= s["latency"]["p95_ms"] <= s["latency"]["p99_ms"]
            assert s["first_output"]["p50_ms"] is not None

        r = c.post("/v1/functions/echo/canary/promote")
        assert r.status_code == 200 and r.json()["version"] == 2
        assert r.json()["canary"] is None
        assert c.get("/v1/functions/echo/canary").status_code == 404
        assert {r["version"] for r in _finish_all(c, 5)} == {2}


def test_abort_sends_every_call_back_to_the_active_version(cp: ControlPlane) -> None:
    cp.worker()
    cp.deploy("echo")
    with cp.client() as c:
        spec = cp.spec("echo", timeout_s=11)
        assert c.post("/v1/functions", params={"canary_pct": 99}, json=spec).status_code == 201
        r = c.post("/v1/functions/echo/canary/abort")
        assert r.status_code == 200 and r.json()["version"] == 1
        assert {r["version"] for r in _finish_all(c, 5)} == {1}
        assert c.post("/v1/functions/echo/canary/abort").status_code == 404

        assert c.post("/v1/functions", params={"canary_pct": 5}, json=spec).status_code == 201
        assert c.delete("/v1/functions/echo").status_code == 204  # its canary goes with it
        assert c.post("/v1/functions", json=cp.spec("echo")).json()["canary"] is None


def _started_versions(worker: FakeWorker) -> list[int]:
    return [p["version"] for t, p in worker.received if t == "thaw.start_replica"]


def _stopped(worker: FakeWorker, version: int) -> bool:
    """Every replica of ``version`` the worker started has been told to stop."""
    started = {
        p["replica_id"]
        for t, p in worker.received
        if t == "thaw.start_replica" and p["version"] == version
    }
    return bool(started) and all(worker.replicas.get(rid) == "stopped" for rid in started)


def _until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not check():
        assert time.monotonic() < deadline, f"{what} did not happen"
        time.sleep(0.05)


def test_calls_queued_on_a_version_that_stops_serving_run_on_that_version(
    cp: ControlPlane,
) -> None:
    """A call keeps the version it was accepted on: an abort or a new deploy leaves
    the calls already queued on the old version to run on it, then its replica drains."""
    worker = cp.worker(start_delay_s=0.5)  # calls queue while replicas start
    cp.deploy("echo")
    with cp.client() as c:
        spec = cp.spec("echo", timeout_s=11)
        assert c.post("/v1/functions", params={"canary_pct": 99.99}, json=spec).status_code == 201
        r = c.post("/v1/functions/echo/invoke", json={"input": 1}, headers=ASYNC)
        accepted = c.get(f"/v1/calls/{r.json()['call_id']}").json()
        assert accepted["version"] == 2  # the canary's (the draw is over 99.99 % likely)
        assert c.post("/v1/functions/echo/canary/abort").status_code == 200
        aborted = _wait(c, r.json()["call_id"])
        assert (aborted["status"], aborted["version"]) == ("succeeded", 2)
        assert aborted["output"]["echo"] == 1
        _until(lambda: _stopped(worker, 2), "the aborted canary's replica to drain")

        queued = [
            c.post("/v1/functions/echo/invoke", json={"input": i}, headers=ASYNC).json()["call_id"]
            for i in range(3)
        ]
        assert c.get("/v1/functions/echo").json()["version"] == 1
        cp.deploy("echo", timeout_s=12)  # a plain deploy: version 3 serves new calls
        after = c.post("/v1/functions/echo/invoke", json={"input": 9}, headers=ASYNC)
        assert [_wait(c, i)["version"] for i in queued] == [1, 1, 1]
        assert _wait(c, after.json()["call_id"])["version"] == 3
        _until(lambda: _stopped(worker, 1), "version 1's replicas to drain")
        assert sorted(set(_started_versions(worker))) == [1, 2, 3]


def test_a_canary_needs_a_version_to_compare_with(cp: ControlPlane) -> None:
    with cp.client() as c:
        r = c.post("/v1/functions", params={"canary_pct": 10}, json=cp.spec("fresh"))
        assert r.status_code == 400 and "deploy it once without --canary" in r.text
        r = c.post("/v1/functions", params={"canary_pct": 100}, json=cp.spec("fresh"))
        assert r.status_code == 422
