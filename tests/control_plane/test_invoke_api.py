"""Invoking through the served API with a fake worker: sync, async, stream, cancel,
idempotency, deadlines, failures, headers and metrics."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.control_plane.conftest import ControlPlane


def _wait_status(c: httpx.Client, call_id: str, statuses: set[str], timeout_s: float = 10) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        body = c.get(f"/v1/calls/{call_id}").json()
        if body["status"] in statuses:
            return dict(body)
        time.sleep(0.02)
    raise AssertionError(f"call {call_id} never reached {statuses}: {body}")


def test_sync_invoke_cold_then_warm_with_headers(cp: ControlPlane) -> None:
    cp.worker(start_delay_s=0.2)
    cp.deploy("echo")
    with cp.client() as c:
        r = c.post("/v1/functions/echo/invoke", json={"input": {"x": 1}})
        assert r.status_code == 200, r.text
        assert r.json()["output"] == {"echo": {"x": 1}, "adapter": None}
        assert r.headers["X-Thaw-Cold"] == "true"
        assert r.headers["X-Thaw-Call-Id"] == r.json()["call_id"]
        timing = r.headers["Server-Timing"]
        assert "schedule;dur=" in timing and "weights_fetch;dur=200" in timing
        assert "queue_wait;dur=" in timing
        r2 = c.post("/v1/functions/echo/invoke", json={"input": 2})
        assert r2.status_code == 200 and r2.headers["X-Thaw-Cold"] == "false"
        assert "weights_fetch" not in r2.headers["Server-Timing"]
        metrics = c.get("/metrics").text
        assert 'thaw_cold_starts_total{function="echo"} 1.0' in metrics
        assert (
            'thaw_call_latency_seconds_count{cold="true",function="echo",status="succeeded"} 1.0'
            in metrics
        )
        assert 'thaw_replicas{function="echo",state="ready"} 1.0' in metrics


def test_async_then_get_and_location(cp: ControlPlane) -> None:
    cp.worker()
    cp.deploy("echo")
    with cp.client() as c:
        r = c.post(
            "/v1/functions/echo/invoke",
            json={"input": {"sleep_s": 0.2}},
            headers={"Prefer": "respond-async"},
        )
        assert r.status_code == 202
        call_id = r.json()["call_id"]
        assert r.headers["Location"] == f"/v1/calls/{call_id}"
        assert r.headers["X-Thaw-Call-Id"] == call_id
        assert r.headers["X-Thaw-Cold"] == "false"  # not known yet: nothing started for it
        assert "control_plane;dur=" in r.headers["Server-Timing"]
        done = _wait_status(c, call_id, {"succeeded"})
        assert done["output"]["echo"] == {"sleep_s": 0.2}
        assert c.get(f"/v1/calls/{call_id}").headers["X-Thaw-Call-Id"] == call_id


def test_cancel_running_call_ends_once_and_worker_is_told(cp: ControlPlane) -> None:
    worker = cp.worker()
    cp.deploy("echo")
    with cp.client() as c:
        r = c.post(
            "/v1/functions/echo/invoke",
            json={"input": {"sleep_s": 5}},
            headers={"Prefer": "respond-async"},
        )
        call_id = r.json()["call_id"]
        _wait_status(c, call_id, {"running"})
        r = c.delete(f"/v1/calls/{call_id}")
        assert r.json()["status"] == "cancelled"
        deadline = time.monotonic() + 5
        while call_id not in worker.cancelled and time.monotonic() < deadline:
            time.sleep(0.02)
        assert call_id in worker.cancelled
        # A second cancel and the worker's late "cancelled" change nothing.
        assert c.delete(f"/v1/calls/{call_id}").json()["status"] == "cancelled"
        assert c.get(f"/v1/calls/{call_id}").json()["status"] == "cancelled"


def test_idempotency_key_returns_same_call_never_runs_twice(cp: ControlPlane) -> None:
    worker = cp.worker()
    cp.deploy("echo")
    headers = {"Idempotency-Key": "order-17"}
    with cp.client() as c:
        a = c.post("/v1/functions/echo/invoke", json={"input": 5}, headers=headers)
        b = c.post("/v1/functions/echo/invoke", json={"input": 5}, headers=headers)
        assert a.status_code == b.status_code == 200
        assert a.json()["call_id"] == b.json()["call_id"]
        runs = [p for t, p in worker.received if t == "thaw.run_call"]
        assert [p["call_id"] for p in runs] == [a.json()["call_id"]]
        r = c.post("/v1/functions/echo/invoke", json={"input": 6}, headers=headers)
        assert r.status_code == 409 and "Idempotency-Key" in r.json()["detail"]
        # Another API key may use the same idempotency key for its own call.
        with cp.client(cp.key("invoke")) as other:
            r = other.post("/v1/functions/echo/invoke", json={"input": 5}, headers=headers)
            assert r.json()["call_id"] != a.json()["call_id"]


def test_concurrent_requests_with_one_idempotency_key_make_one_call(cp: ControlPlane) -> None:
    worker = cp.worker()
    cp.deploy("echo")
    headers = {"Idempotency-Key": "order-18", "Prefer": "respond-async"}

    def send(_: int) -> str:
        with cp.client() as c:
            r = c.post("/v1/functions/echo/invoke", json={"input": 7}, headers=headers)
            assert r.status_code == 202, r.text
            return str(r.json()["call_id"])

    with ThreadPoolExecutor(8) as pool:
        ids = set(pool.map(send, range(8)))
    assert len(ids) == 1
    with cp.client() as c:
        _wait_status(c, next(iter(ids)), {"succeeded"})
    assert [p["call_id"] for t, p in worker.received if t == "thaw.run_call"] == list(ids)


def test_stream_sse_outputs_then_done(cp: ControlPlane) -> None:
    cp.worker()
    cp.deploy("echo")
    with cp.client() as c:
        with c.stream(
            "POST",
            "/v1/functions/echo/invoke",
            json={"input": {"chunks": 3}},
            headers={"Accept": "text/event-stream"},
        ) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            assert r.headers["X-Thaw-Cold"] == "true"
            text = "".join(r.iter_text())
        events = [
            (block.split("\n")[0][len("event: ") :], json.loads(block.split("\n")[1][6:]))
            for block in text.strip().split("\n\n")
        ]
        assert [e for e, _ in events] == ["output", "output", "output", "done"]
        assert [d for _, d in events[:3]] == [{"i": 0}, {"i": 1}, {"i": 2}]
        done = events[-1][1]
        assert done["status"] == "succeeded" and "first_output" in done["timings_ms"]


def test_deadline_while_replica_starts_is_504_with_phases(cp: ControlPlane) -> None:
    cp.worker(start_delay_s=2.0)
    cp.deploy("echo")
    with cp.client() as c:
        r = c.post(
            "/v1/functions/echo/invoke", json={"input": 1}, headers={"X-Thaw-Deadline-Ms": "300"}
        )
        assert r.status_code == 504
        body = r.json()
        assert "schedule" in body["phases_ms"]
        assert "schedule;dur=" in r.headers["Server-Timing"]
        # It never left the queue: expired, not timeout.
        assert c.get(f"/v1/calls/{body['call_id']}").json()["status"] == "expired"


def test_failed_call_is_500_with_error(cp: ControlPlane) -> None:
    cp.worker()
    cp.deploy("echo")
    with cp.client() as c:
        r = c.post("/v1/functions/echo/invoke", json={"input": {"fail": "boom"}})
        assert r.status_code == 500
        assert r.json()["status"] == "failed" and r.json()["error"] == "boom"


def test_replica_start_failure_fails_waiting_call_with_its_error(cp: ControlPlane) -> None:
    cp.worker(fail_start="ImportError: no module named torchvision")
    cp.deploy("echo")
    with cp.client() as c:
        r = c.post("/v1/functions/echo/invoke", json={"input": 1})
        assert r.status_code == 500
        assert "torchvision" in r.json()["error"]


def test_adapter_routing_and_unknown_adapter(cp: ControlPlane) -> None:
    worker = cp.worker()
    cp.deploy("echo", adapters=[{"name": "fr", "ref": cp.store.adapter_refs[0]}])
    with cp.client() as c:
        r = c.post("/v1/functions/echo/invoke", json={"input": 1, "adapter": "fr"})
        assert r.status_code == 200 and r.json()["output"]["adapter"] == "fr"
        start = next(p for t, p in worker.received if t == "thaw.start_replica")
        assert start["adapters"][0]["name"] == "fr"
        assert start["adapters"][0]["digest"].startswith("blake3:")
        r = c.post("/v1/functions/echo/invoke", json={"input": 1, "adapter": "de"})
        assert r.status_code == 400 and "'de'" in r.json()["detail"]


def test_an_unlisted_adapter_for_a_class_without_load_adapter_is_400(cp: ControlPlane) -> None:
    worker = cp.worker()
    listed = [{"name": "fr", "ref": cp.store.adapter_refs[0]}]
    cp.deploy("plain", bundle=cp.store.plain_bundle, adapters=listed)
    cp.deploy("loader", adapters=listed)  # its class defines load_adapter
    unlisted = cp.store.adapter_refs[1]
    with cp.client() as c:
        r = c.post("/v1/functions/plain/invoke", json={"input": 1, "adapter": unlisted})
        assert r.status_code == 400, r.text
        detail = r.json()["detail"]
        assert "defines no load_adapter(self, adapter)" in detail and "it lists fr" in detail
        assert not [p for t, p in worker.received if t == "thaw.run_call"]  # never accepted
        r = c.post("/v1/functions/plain/invoke", json={"input": 1, "adapter": "fr"})
        assert r.status_code == 200, r.text
        r = c.post("/v1/functions/loader/invoke", json={"input": 1, "adapter": unlisted})
        assert r.status_code == 200 and r.json()["output"]["adapter"] == unlisted


def test_bad_input_statuses(cp: ControlPlane) -> None:
    cp.deploy("echo")
    with cp.client() as c:
        assert c.post("/v1/functions/nosuch/invoke", json={"input": 1}).status_code == 404
        r = c.post("/v1/functions/echo/invoke", json={"input": 1, "bogus": 2})
        assert r.status_code == 422 and "bogus" in r.text
        r = c.post(
            "/v1/functions/echo/invoke", json={"input": 1}, headers={"X-Thaw-Deadline-Ms": "-5"}
        )
        assert r.status_code == 422 and "x-thaw-deadline-ms" in r.text
        big = {"input": "x" * (cp.settings.max_body_bytes + 10)}
        assert c.post("/v1/functions/echo/invoke", json=big).status_code == 413
        assert c.get("/v1/calls/nosuch").status_code == 404
        nan = b'{"input": NaN}'
        r = c.post(
            "/v1/functions/echo/invoke", content=nan, headers={"content-type": "application/json"}
        )
        assert r.status_code == 400 and "strict JSON" in r.json()["detail"]
        huge = {"worker_id": "w", "memory_bytes": 2**70}
        r = c.post("/v1/workers/register", json=huge)
        assert r.status_code == 422 and "memory_bytes" in r.text
        r = c.post("/v1/functions/echo/rollback", json={"version": 2**70})
        assert r.status_code == 422


def test_deadline_without_any_worker_says_why(cp: ControlPlane) -> None:
    cp.deploy("echo", device="cuda")
    cp.worker()  # CPU only: nothing can host a CUDA replica
    with cp.client() as c:
        r = c.post(
            "/v1/functions/echo/invoke", json={"input": 1}, headers={"X-Thaw-Deadline-Ms": "400"}
        )
        assert r.status_code == 504
        assert "needs a CUDA device" in r.json()["detail"]


def test_stream_deadline_ends_with_error_event(cp: ControlPlane) -> None:
    cp.worker()
    cp.deploy("echo")
    with cp.client() as c:
        # Warm first: a deadline that passes while the replica starts is a 504 before
        # the stream opens (above); this one must pass while the call runs.
        assert c.post("/v1/functions/echo/invoke", json={"input": 1}).status_code == 200
        with c.stream(
            "POST",
            "/v1/functions/echo/invoke",
            json={"input": {"sleep_s": 5}},
            headers={"Accept": "text/event-stream", "X-Thaw-Deadline-Ms": "1500"},
        ) as r:
            text = "".join(r.iter_text())
    assert r.status_code == 200
    assert text.startswith("event: error\n") and "deadline" in text


def test_worker_events_after_final_or_stale_or_newer_protocol(cp: ControlPlane) -> None:
    cp.worker()
    cp.deploy("echo")
    with cp.client() as c, cp.client(cp.key("worker")) as w:
        call_id = c.post("/v1/functions/echo/invoke", json={"input": 1}).json()["call_id"]
        late = {"attempt": 1, "kind": "failed", "error": "late"}
        r = w.post(f"/v1/calls/{call_id}/events", json=late)
        assert r.status_code == 409 and "already succeeded" in r.json()["detail"]
        assert c.get(f"/v1/calls/{call_id}").json()["status"] == "succeeded"
        r = w.post(f"/v1/calls/{call_id}/events", json={"v": 2, "kind": "started"})
        assert r.status_code == 422 and "protocol version 2" in r.text
        r = w.post("/v1/calls/nosuch/events", json={"kind": "started"})
        assert r.status_code == 404
        r = w.post("/v1/replicas/nosuch/events", json={"state": "ready"})
        assert r.status_code == 404
        r = w.post("/v1/workers/nosuch/heartbeat", json={})
        assert r.status_code == 404 and "register" in r.json()["detail"]
