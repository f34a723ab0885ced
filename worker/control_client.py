"""The worker's HTTP client for the control plane (see ``control_plane.protocol``).

Terminal reports (a call's final event, a replica's state) are retried with
backoff, because the control plane must learn them; a call event answered
409 means the call is already final there, which ``post_call_event``
returns as ``False`` so the caller stops sending for it. Errors that
retrying cannot fix (401, 403, 404, 422) are raised at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
from pydantic import BaseModel

from control_plane.protocol import (
    CallEvent,
    HeartbeatReply,
    ReplicaEvent,
    WorkerHeartbeat,
    WorkerRegister,
    WorkerRegistered,
)

RETRY_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
CALL_EVENT_ATTEMPTS = 36  # backoff 0.1 s doubling to 2 s: about 65 s in all


class ControlPlaneError(Exception):
    """The control plane refused a request (``status_code``), or could not be reached (None)."""

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class ControlPlaneClient:
    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout_s: float = 10.0,
        sleep: Callable[[float], None] = time.sleep,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=timeout_s,
            transport=transport,
        )
        self._sleep = sleep

    def close(self) -> None:
        self._http.close()

    def register(self, msg: WorkerRegister, attempts: int = 30) -> WorkerRegistered:
        r = self._post("/v1/workers/register", msg, attempts)
        return WorkerRegistered.model_validate(r.json())

    def heartbeat(self, worker_id: str, msg: WorkerHeartbeat) -> HeartbeatReply:
        r = self._post(f"/v1/workers/{worker_id}/heartbeat", msg, attempts=1)
        return HeartbeatReply.model_validate(r.json())

    def replica_event(self, replica_id: str, msg: ReplicaEvent, attempts: int = 8) -> None:
        self._post(f"/v1/replicas/{replica_id}/events", msg, attempts)

    def call_event(self, call_id: str, msg: CallEvent, attempts: int = CALL_EVENT_ATTEMPTS) -> bool:
        """Post one call event; ``False`` when the call is already final (409).

        Retried for about a minute: a control plane restarting must not lose a
        call's outputs or result (the call waits meanwhile)."""
        r = self._post(f"/v1/calls/{call_id}/events", msg, attempts, accept={409})
        return r.status_code != 409

    def _post(
        self,
        path: str,
        msg: BaseModel,
        attempts: int,
        accept: frozenset[int] | set[int] = frozenset(),
    ) -> httpx.Response:
        body = msg.model_dump(mode="json")
        delay_s = 0.1
        for attempt in range(1, attempts + 1):
            try:
                r = self._http.post(path, json=body)
            except httpx.TransportError as exc:
                if attempt == attempts:
                    raise ControlPlaneError(
                        f"cannot reach the control plane at {self._http.base_url} ({exc}); "
                        "check THAW_SERVER_URL and that `thaw server` is running"
                    ) from None
            else:
                if r.status_code < 300 or r.status_code in accept:
                    return r
                if r.status_code not in RETRY_STATUS or attempt == attempts:
                    raise ControlPlaneError(_refusal(path, r), r.status_code)
            self._sleep(delay_s)
            delay_s = min(delay_s * 2, 2.0)
        raise AssertionError("unreachable: the loop returns or raises")


def _refusal(path: str, r: httpx.Response) -> str:
    hint = " (check THAW_API_KEY: it needs scope worker)" if r.status_code in (401, 403) else ""
    return f"POST {path} was refused with {r.status_code}: {_detail(r)[:500]}{hint}"


def _detail(r: httpx.Response) -> str:
    """The control plane's own message (``{"detail": "..."}``), else the raw body."""
    try:
        detail = r.json().get("detail")
    except (ValueError, AttributeError):
        return r.text
    return detail if isinstance(detail, str) else r.text
