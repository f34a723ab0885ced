"""The worker's HTTP client: what it retries, what it raises, and 409 for final calls."""

from __future__ import annotations

import httpx
import pytest

from control_plane.protocol import CallEvent, ReplicaEvent, WorkerHeartbeat
from worker.control_client import ControlPlaneClient, ControlPlaneError


def client(responses: list[int], seen: list[httpx.Request]) -> ControlPlaneClient:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        status = responses.pop(0) if responses else 200
        body: dict[str, list[str]] = (
            {"cancel_call_ids": [], "stop_replica_ids": []} if status == 200 else {}
        )
        return httpx.Response(status, json=body)

    return ControlPlaneClient(
        "http://cp.test/", "secret", sleep=lambda _s: None, transport=httpx.MockTransport(handler)
    )


def test_transient_errors_are_retried_and_the_key_is_sent() -> None:
    seen: list[httpx.Request] = []
    c = client([503, 502], seen)
    c.replica_event("r1", ReplicaEvent(state="ready"))
    assert len(seen) == 3
    assert seen[-1].headers["Authorization"] == "Bearer secret"
    assert seen[-1].url.path == "/v1/replicas/r1/events"


def test_409_means_the_call_is_final_there() -> None:
    seen: list[httpx.Request] = []
    assert client([409], seen).call_event("c1", CallEvent(kind="output")) is False
    assert client([], seen).call_event("c1", CallEvent(kind="output")) is True


@pytest.mark.parametrize(("status", "hint"), [(401, "THAW_API_KEY"), (404, "404")])
def test_refusals_are_raised_at_once_with_their_status(status: int, hint: str) -> None:
    seen: list[httpx.Request] = []
    with pytest.raises(ControlPlaneError, match=hint) as info:
        client([status], seen).heartbeat("w1", WorkerHeartbeat())
    assert info.value.status_code == status and len(seen) == 1


def test_unreachable_control_plane_names_the_setting() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    c = ControlPlaneClient(
        "http://cp.test", "k", sleep=lambda _s: None, transport=httpx.MockTransport(refuse)
    )
    with pytest.raises(ControlPlaneError, match="THAW_SERVER_URL") as info:
        c.replica_event("r1", ReplicaEvent(state="ready"), attempts=3)
    assert info.value.status_code is None
