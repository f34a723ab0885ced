"""Lost workers, retries, scale to zero, version switches, and the one-final-state guard."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import httpx

from control_plane.db import migrate
from control_plane.db.models import Call
from control_plane.db.session import Database
from control_plane.services import calls
from tests.control_plane.conftest import ControlPlane


def _wait(pred: Callable[[], bool], timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def _call(c: httpx.Client, call_id: str) -> dict:
    return dict(c.get(f"/v1/calls/{call_id}").json())


def _async(c: httpx.Client, name: str, data: object) -> str:
    r = c.post(
        f"/v1/functions/{name}/invoke", json={"input": data}, headers={"Prefer": "respond-async"}
    )
    assert r.status_code == 202, r.text
    return str(r.json()["call_id"])


def test_lost_worker_call_is_retried_on_another_worker(cp: ControlPlane) -> None:
    first = cp.worker()
    cp.deploy("echo", retries=1)
    with cp.client() as c:
        call_id = _async(c, "echo", {"sleep_s": 2})
        _wait(lambda: _call(c, call_id)["status"] == "running")
        second = cp.worker()
        first.stop()  # dies without a word: no events, no heartbeats
        _wait(lambda: _call(c, call_id)["status"] == "succeeded")
        done = _call(c, call_id)
        assert done["attempt"] == 2
        ran_on_second = [p["call_id"] for t, p in second.received if t == "thaw.run_call"]
        assert ran_on_second == [call_id]


def test_lost_worker_call_without_retries_fails_once(cp: ControlPlane) -> None:
    first = cp.worker()
    cp.deploy("echo", retries=0)
    with cp.client() as c:
        call_id = _async(c, "echo", {"sleep_s": 5})
        _wait(lambda: _call(c, call_id)["status"] == "running")
        first.stop()
        _wait(lambda: _call(c, call_id)["status"] == "failed")
        assert "stopped heartbeating" in _call(c, call_id)["error"]


def test_scale_to_zero_after_idle_timeout(cp: ControlPlane) -> None:
    worker = cp.worker()
    cp.deploy("echo", scaling={"max_replicas": 1, "idle_timeout_s": 0.3})
    with cp.client() as c:
        assert c.post("/v1/functions/echo/invoke", json={"input": 1}).status_code == 200
    _wait(lambda: list(worker.replicas.values()) == ["stopped"])
    stops = [p for t, p in worker.received if t == "thaw.stop_replica"]
    assert stops and stops[0]["reason"] == "scaled down"


def test_min_replicas_keeps_one_warm_and_new_version_replaces_old(cp: ControlPlane) -> None:
    worker = cp.worker()
    cp.deploy("echo", scaling={"min_replicas": 1, "max_replicas": 1})
    _wait(lambda: list(worker.replicas.values()) == ["ready"])
    old = next(iter(worker.replicas))
    cp.deploy("echo", scaling={"min_replicas": 1, "max_replicas": 1}, timeout_s=5)
    _wait(lambda: worker.replicas.get(old) == "stopped" and "ready" in worker.replicas.values())
    with cp.client() as c:
        r = c.post("/v1/functions/echo/invoke", json={"input": 1})
        assert r.status_code == 200 and r.json()["version"] == 2
        assert r.headers["X-Thaw-Cold"] == "false"


def test_exactly_one_final_state_under_concurrent_enders(db_url: str) -> None:
    migrate.upgrade(db_url)
    db = Database(db_url)
    with db.session() as s:
        s.add(
            Call(
                id="c1",
                function="f",
                version=1,
                api_key_id="k",
                status="running",
                input_json="1",
                timeout_s=1,
                accepted_at=0,
                deadline_at=1,
            )
        )
    winners: list[str] = []
    statuses = ["succeeded", "failed", "timeout", "cancelled"] * 3
    barrier = threading.Barrier(len(statuses))

    def end(status: str) -> None:
        barrier.wait()
        with db.session() as s:
            if calls.finalize(s, None, 1.0, "c1", status, output=status) is not None:
                winners.append(status)

    threads = [threading.Thread(target=end, args=(st,)) for st in statuses]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with db.session() as s:
        final = calls.get(s, "c1")
    db.dispose()
    assert len(winners) == 1
    assert final.status == winners[0]


def test_worker_that_restarts_gets_its_running_calls_retried(cp: ControlPlane) -> None:
    worker = cp.worker()
    cp.deploy("echo", retries=1)
    with cp.client() as c:
        call_id = _async(c, "echo", {"sleep_s": 1})
        _wait(lambda: _call(c, call_id)["status"] == "running")
        again = {"worker_id": worker.id, "name": "fake", "devices": [{"kind": "cpu"}]}
        with cp.client(cp.key("worker")) as w:
            assert w.post("/v1/workers/register", json=again).status_code == 200
        _wait(lambda: _call(c, call_id)["status"] == "succeeded")
        done = _call(c, call_id)
        assert done["attempt"] == 2
        runs = [p for t, p in worker.received if t == "thaw.run_call" and p["call_id"] == call_id]
        assert [p["attempt"] for p in runs] == [1, 2]


def test_replica_that_never_gets_ready_fails_the_waiting_call(
    cp_factory: Callable[..., ControlPlane],
) -> None:
    cp = cp_factory(replica_start_timeout_s=0.5)
    worker = cp.worker(start_delay_s=30)
    cp.deploy("echo")
    with cp.client() as c:
        r = c.post("/v1/functions/echo/invoke", json={"input": 1})
        assert r.status_code == 500
        assert "did not become ready within 0.5 s" in r.json()["error"]
    _wait(lambda: any(t == "thaw.stop_replica" for t, _ in worker.received))
    with cp.client() as c:
        health = c.get("/v1/functions/echo").json()["health"]
    # Issue #25: the reason a start was given up is on the function's record.
    assert health["state"] == "failing", health
    assert "did not become ready within 0.5 s" in health["last_error"]
    assert f"worker fake-{worker.id[:8]}" in health["last_error"]


def test_a_retried_output_post_is_stored_once_in_the_workers_order(cp: ControlPlane) -> None:
    cp.worker()
    cp.deploy("echo")
    worker_key = cp.key("worker")
    with cp.client() as c, cp.client(worker_key) as w:
        call_id = _async(c, "echo", {"sleep_s": 3})
        _wait(lambda: _call(c, call_id)["status"] == "running")
        post = f"/v1/calls/{call_id}/events"
        # Chunk 2 arrives before chunk 1, and chunk 1 twice (a retried post); then
        # chunks 3-5 in one event, posted twice, and chunk 4 again alone.
        for seq, out in ((2, "b"), (1, "a"), (1, "a")):
            r = w.post(post, json={"kind": "output", "output": out, "seq": seq})
            assert r.status_code == 200, r.text
        for event in (
            {"outputs": ["c", "d", "e"], "seq": 3},
            {"outputs": ["c", "d", "e"], "seq": 3},
            {"output": "d", "seq": 4},
        ):
            r = w.post(post, json={"kind": "output", **event})
            assert r.status_code == 200, r.text
        db = Database(cp.settings.database_url_resolved())
        with db.session() as s:
            stored = calls.outputs_after(s, call_id, 1, 0)
            assert stored == [(1, "a"), (2, "b"), (3, "c"), (4, "d"), (5, "e")]
        db.dispose()


def test_a_call_that_found_its_replica_gone_runs_again(cp: ControlPlane) -> None:
    cp.worker()
    cp.deploy("echo", retries=1)
    with cp.client() as c, cp.client(cp.key("worker")) as w:
        call_id = _async(c, "echo", {"sleep_s": 3})
        _wait(lambda: _call(c, call_id)["status"] == "running")
        # What a worker says when the call arrives after its replica died: not run.
        gone = {"kind": "failed", "error": "replica r is not running", "not_run": True}
        assert w.post(f"/v1/calls/{call_id}/events", json=gone).status_code == 200
        _wait(lambda: _call(c, call_id)["status"] == "succeeded", timeout_s=30)
        assert _call(c, call_id)["attempt"] == 2
