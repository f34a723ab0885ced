"""The cold-start books through the served API, with fake workers over real HTTP:
placement by what each worker holds, the phases of a cold call adding up to
what the caller waited, stats percentiles, metrics, and warm-ups of N replicas."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from control_plane.protocol import TierHolding
from tests.control_plane.conftest import ControlPlane


def _wait(predicate: Callable[[], Any], timeout_s: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def _model(c: httpx.Client, ref: str) -> tuple[str, int]:
    m = c.get(f"/v1/models/{ref}").json()
    return str(m["digest"]), int(m["raw_size_bytes"])


def _tiers_of(c: httpx.Client, worker_id: str) -> set[str]:
    rows = c.get("/v1/workers").json()
    return {t["tier"] for w in rows if w["id"] == worker_id for t in w["cache"]}


def _started_on(cp: ControlPlane) -> list[str]:
    return [w.id for w in cp.workers for task, _ in w.received if task == "thaw.start_replica"]


def test_placement_chooses_the_worker_that_holds_the_model(cp: ControlPlane) -> None:
    with cp.client() as c:
        digest, size = _model(c, cp.store.model_ref)
        # The empty worker sorts first, so only the holdings can make the holder win.
        cp.worker(worker_id="a-empty")
        holder = cp.worker(
            worker_id="b-holder", holdings=[TierHolding(tier="ram", digest=digest, bytes=size)]
        )
        _wait(lambda: "ram" in _tiers_of(c, holder.id))
        cp.deploy("echo")
        r = c.post("/v1/functions/echo/invoke", json={"input": 1})
        assert r.status_code == 200 and r.headers["X-Thaw-Cold"] == "true"
        assert _started_on(cp) == ["b-holder"]


def test_cold_call_phases_add_up_to_what_the_caller_waited(cp: ControlPlane) -> None:
    known = {"pool_acquire": 50.0, "weights_fetch": 200.0, "user_setup": 100.0}
    cp.worker(phases_ms=known)
    cp.deploy("echo")
    with cp.client() as c:
        r = c.post("/v1/functions/echo/invoke", json={"input": 1})
        assert r.status_code == 200 and r.headers["X-Thaw-Cold"] == "true"
        call = c.get(f"/v1/calls/{r.json()['call_id']}").json()
    phases = call["phases_ms"]
    assert all(phases[k] >= ms for k, ms in known.items())
    assert {"schedule", "transit", "first_output"} <= set(phases)
    total_ms = (call["finished_at"] - call["accepted_at"]) * 1000
    # transit is the StartReplica's trip to the worker and the ready event's
    # post: with it, nothing the caller waited is left out (to float rounding).
    assert sum(phases.values()) == pytest.approx(total_ms, abs=0.01), (phases, total_ms)
    timing = r.headers["Server-Timing"]
    assert "schedule;dur=" in timing and "first_output;dur=" in timing


def _nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]


def test_stats_percentiles_match_the_recorded_calls(cp: ControlPlane) -> None:
    cp.worker(start_delay_s=0.1)
    cp.deploy("echo")
    with cp.client() as c:
        for i in range(12):
            body = {"input": {"sleep_s": 0.01 * (i % 5), "i": i}}
            assert c.post("/v1/functions/echo/invoke", json=body).status_code == 200
        stats = c.get("/v1/functions/echo/stats").json()
        calls = c.get("/v1/functions/echo/calls").json()
    for kind, cold in (("warm", False), ("cold", True)):
        lat = [(x["finished_at"] - x["accepted_at"]) * 1000 for x in calls if x["cold"] is cold]
        assert stats[kind]["count"] == len(lat) > 0
        for q in (50, 90, 95, 99):
            assert stats[kind][f"p{q}_ms"] == _nearest_rank(lat, q)
    assert stats["cold_start_rate"] == sum(x["cold"] for x in calls) / len(calls)
    medians = stats["phase_medians_ms"]
    assert medians["weights_fetch"] == 100.0
    assert next(iter(medians)) == "schedule" and "first_output" in medians


def test_metrics_export_phases_timings_adapters_and_pool(cp: ControlPlane) -> None:
    worker = cp.worker(pool=(3, 2, 1), gpu_utilization_pct=[37.5, 0.0])
    cp.deploy("echo", adapters=[{"name": "fr", "ref": cp.store.adapter_refs[0]}])
    with cp.client() as c:
        for _ in range(3):
            body = {"input": 1, "adapter": "fr"}
            assert c.post("/v1/functions/echo/invoke", json=body).status_code == 200
        _wait(
            lambda: f'thaw_worker_pool_idle{{worker="{worker.id}"}} 2.0' in c.get("/metrics").text
        )
        text = c.get("/metrics").text
    assert f'thaw_worker_pool_size{{worker="{worker.id}"}} 3.0' in text
    assert f'thaw_worker_pool_busy{{worker="{worker.id}"}} 1.0' in text
    gpu = "thaw_worker_gpu_utilization_ratio"
    assert f'{gpu}{{device="0",worker="{worker.id}"}} 0.375' in text
    assert f'{gpu}{{device="1",worker="{worker.id}"}} 0.0' in text
    assert 'thaw_adapter_hits_total{function="echo"} 2.0' in text
    assert 'thaw_adapter_misses_total{function="echo"} 1.0' in text
    for phase in ("schedule", "pool_acquire", "first_output"):
        assert f'thaw_cold_start_phase_seconds_count{{function="echo",phase="{phase}"}} 1.0' in text
    for timing in ("queue_wait", "execution", "total"):
        series = f'thaw_call_timing_seconds_count{{cold="false",function="echo",timing="{timing}"}}'
        assert f"{series} 2.0" in text
    assert 'timing="adapter_load"} 1.0' in text


def test_warm_n_replicas_spreads_them_and_refuses_more_than_max(cp: ControlPlane) -> None:
    cp.worker()
    cp.deploy("echo")
    with cp.client() as c:
        r = c.post("/v1/functions/echo/warm", json={"replicas": 2})
        assert r.status_code == 202, r.text
        body = r.json()
        assert len(body["started_replica_ids"]) == 2 and body["live_replicas"] == 2
        _wait(lambda: c.get("/v1/functions/echo/stats").json()["replicas"] == {"ready": 2})
        again = c.post("/v1/functions/echo/warm", json={"replicas": 2}).json()
        assert again["started_replica_ids"] == [] and again["live_replicas"] == 2
        too_many = c.post("/v1/functions/echo/warm", json={"replicas": 3})
        assert too_many.status_code == 400 and "max_replicas" in too_many.json()["detail"]
