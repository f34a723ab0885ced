"""Routing through the served API with a fake worker: a session sticks to the
replica that served it, an adapter the function does not list is loaded on first
use (and then preferred), and one the store lacks is refused."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from cli.main import app
from control_plane.db.models import Call
from control_plane.db.session import Database
from control_plane.services.router import rendezvous_order
from tests.control_plane.conftest import ControlPlane
from tests.control_plane.fake_worker import FakeWorker


@pytest.fixture
def cp(cp_factory: Callable[..., ControlPlane]) -> ControlPlane:
    # Heartbeats every 1 s (lost after 3 s): a fake worker on a busy machine is
    # not taken for lost mid-test (these tests are about routing, not losses).
    return cp_factory(heartbeat_interval_s=1.0)


def _wait(pred: Callable[[], bool], timeout_s: float = 15) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def _replica_of(worker: FakeWorker, call_id: str) -> str:
    [rid] = [p["replica_id"] for t, p in worker.received if p.get("call_id") == call_id]
    return str(rid)


def _invoke(c: httpx.Client, body: dict, session: str | None = None) -> str:
    headers = {"X-Thaw-Session": session} if session else {}
    r = c.post("/v1/functions/echo/invoke", json=body, headers=headers)
    assert r.status_code == 200, r.text
    return str(r.json()["call_id"])


def _two_ready_replicas(
    cp: ControlPlane, c: httpx.Client, **spec: object
) -> tuple[FakeWorker, str, str]:
    worker = cp.worker()
    scaling = {"min_replicas": 2, "max_replicas": 2, "idle_timeout_s": 60}
    cp.deploy("echo", scaling=scaling, **spec)
    ready = 'thaw_replicas{function="echo",state="ready"} 2.0'
    _wait(lambda: ready in c.get("/metrics").text)
    low, high = sorted(worker.replicas)
    return worker, low, high


def _busy(c: httpx.Client, body: dict) -> str:
    """Start a long call (async) and wait until it runs: its replica is full."""
    r = c.post("/v1/functions/echo/invoke", json=body, headers={"Prefer": "respond-async"})
    call_id = str(r.json()["call_id"])
    _wait(lambda: c.get(f"/v1/calls/{call_id}").json()["status"] == "running")
    return call_id


def _done(c: httpx.Client, call_id: str) -> None:
    _wait(lambda: c.get(f"/v1/calls/{call_id}").json()["status"] == "succeeded")


def test_a_session_sticks_to_its_replica_and_unlisted_adapters_load_on_first_use(
    cp: ControlPlane,
) -> None:
    with cp.client() as c:
        listed = [{"name": "fr", "ref": cp.store.adapter_refs[0]}]
        worker, low, high = _two_ready_replicas(cp, c, adapters=listed)
        # Both idle: the default (least outstanding, then id) is `low`. Keep `low`
        # busy so the session's first call lands on `high`.
        long_call = _busy(c, {"input": {"sleep_s": 4.0}})  # busy past a slow step
        assert _replica_of(worker, long_call) == low
        first = _invoke(c, {"input": 1}, session="chat-1")
        assert _replica_of(worker, first) == high
        _done(c, long_call)
        # Both idle again: the session goes back to `high`, a call without one to `low`.
        for _ in range(3):
            assert _replica_of(worker, _invoke(c, {"input": 2}, session="chat-1")) == high
        assert _replica_of(worker, _invoke(c, {"input": 3})) == low

        # An adapter the function does not list, but the store has: accepted, and
        # loaded on first use by the replica that took it (`high`, as `low` is busy).
        unlisted = cp.store.adapter_refs[1]
        long_call = _busy(c, {"input": {"sleep_s": 4.0}})  # busy past a slow step
        assert _replica_of(worker, long_call) == low
        r = c.post("/v1/functions/echo/invoke", json={"input": 4, "adapter": unlisted})
        assert r.status_code == 200 and r.json()["output"]["adapter"] == unlisted
        assert _replica_of(worker, r.json()["call_id"]) == high
        _done(c, long_call)
        # The replica reported holding it: its next calls prefer `high` over `low`.
        r = c.post("/v1/functions/echo/invoke", json={"input": 5, "adapter": unlisted})
        assert r.status_code == 200 and _replica_of(worker, r.json()["call_id"]) == high

        r = c.post("/v1/functions/echo/invoke", json={"input": 6, "adapter": "nosuch:v1"})
        assert r.status_code == 400 and "'nosuch:v1'" in r.json()["detail"]

        text = c.get("/metrics").text
    assert 'thaw_route_affinity_total{function="echo",kind="session",outcome="hit"} 3.0' in text
    assert 'thaw_route_affinity_total{function="echo",kind="session",outcome="new"} 1.0' in text
    assert 'kind="session",outcome="miss"' not in text
    assert 'thaw_adapter_misses_total{function="echo"} 1.0' in text
    assert 'thaw_adapter_hits_total{function="echo"} 1.0' in text


def test_calls_sharing_a_prompt_prefix_go_to_the_prefixs_replica(cp: ControlPlane) -> None:
    with cp.client() as c:
        routing = {"prompt_field": "prompt", "prefix_chars": 16}
        worker, low, high = _two_ready_replicas(cp, c, routing=routing)
        # A prefix whose replica is `high`, which the default (idle: `low`) never picks.
        prefix = next(
            p
            for p in (f"system prompt {i:02d}" for i in range(100))
            if rendezvous_order(p[:16], [low, high])[0] == high
        )
        for tail in ("hello", "what time is it?", "bye"):
            call_id = _invoke(c, {"input": {"prompt": prefix + tail}})
            assert _replica_of(worker, call_id) == high
        assert _replica_of(worker, _invoke(c, {"input": {"no_prompt": 1}})) == low
        text = c.get("/metrics").text
    assert 'thaw_route_affinity_total{function="echo",kind="prefix",outcome="hit"} 3.0' in text


def test_cli_invoke_sends_the_session_and_an_unlisted_adapter(cp: ControlPlane) -> None:
    worker = cp.worker()
    cp.deploy("echo")
    env = {
        "THAW_SERVER_URL": cp.base_url,
        "THAW_API_KEY": cp.admin_token,
        "THAW_HOME": str(cp.settings.home),
    }
    adapter = cp.store.adapter_refs[1]
    args = ["invoke", "echo", "--data", "1", "--session", "chat-9", "--adapter", adapter]
    r = CliRunner().invoke(app, args, env=env)
    assert r.exit_code == 0, r.output
    [run] = [p for t, p in worker.received if t == "thaw.run_call"]
    assert run["adapter"] == adapter
    db = Database(cp.settings.database_url_resolved())
    try:
        with db.session() as s:
            assert s.scalar(select(Call.session_id).where(Call.id == run["call_id"])) == "chat-9"
    finally:
        db.dispose()
