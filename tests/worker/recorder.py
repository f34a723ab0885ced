"""A control plane stand-in for worker tests: records what the worker posts.

It sits behind httpx's transport interface (``httpx.MockTransport``), so the
worker's real client code runs; only the server is replaced. Tests of the
whole path against the real control plane live in ``tests/e2e``.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx

from worker.control_client import ControlPlaneClient


class Recorder:
    def __init__(self, final_call_ids: set[str] | None = None) -> None:
        self.posts: list[tuple[str, dict[str, Any]]] = []
        self.final_call_ids = final_call_ids or set()  # answered 409
        self.heartbeat_reply: dict[str, Any] = {"cancel_call_ids": [], "stop_replica_ids": []}
        self.heartbeat_status = 200
        self._cond = threading.Condition()

    def handler(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        path = request.url.path
        with self._cond:
            self.posts.append((path, body))
            self._cond.notify_all()
        if path.endswith("/register"):
            return httpx.Response(
                200,
                json={"worker_id": body["worker_id"], "queue": "q", "heartbeat_interval_s": 0.2},
            )
        if path.endswith("/heartbeat"):
            return httpx.Response(self.heartbeat_status, json=self.heartbeat_reply)
        if path.startswith("/v1/calls/") and path.split("/")[3] in self.final_call_ids:
            return httpx.Response(409, json={"detail": "final"})
        return httpx.Response(200, json={})

    def client(self) -> ControlPlaneClient:
        return ControlPlaneClient(
            "http://cp.test", "key", transport=httpx.MockTransport(self.handler)
        )

    def events(self, prefix: str) -> list[dict[str, Any]]:
        with self._cond:
            return [body for path, body in self.posts if path.startswith(prefix)]

    def wait_for(self, prefix: str, pred: Any, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """Block until an event under ``prefix`` satisfies ``pred``; return all under it."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                found = [b for p, b in self.posts if p.startswith(prefix)]
                if any(pred(b) for b in found):
                    return found
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"no matching event under {prefix}: {found}")
                self._cond.wait(remaining)
