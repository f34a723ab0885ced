"""Who sees a call, on the served app (SQLite and PostgreSQL): the key that made it
and admin keys; any other key hears 404, as for a call that does not exist, on
every call route. And a key without an operation's scope hears 403 whatever body
it sent, before the body is read (``api.scopes``)."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.control_plane.conftest import ControlPlane

INVOKE = "/v1/functions/echo/invoke"


def _start_call(c: httpx.Client, idempotency_key: str) -> str:
    """An async call that runs for a while (the fake worker sleeps ``sleep_s``)."""
    headers = {"Prefer": "respond-async", "Idempotency-Key": idempotency_key}
    r = c.post(INVOKE, json={"input": {"sleep_s": 5}}, headers=headers)
    assert r.status_code == 202, r.text
    return str(r.json()["call_id"])


def _wait_status(c: httpx.Client, call_id: str, status: str) -> None:
    deadline = time.monotonic() + 10
    while c.get(f"/v1/calls/{call_id}").json()["status"] != status:
        assert time.monotonic() < deadline, f"call {call_id} never reached {status}"
        time.sleep(0.02)


def _stream_call_id(c: httpx.Client, idempotency_key: str) -> tuple[int, str | None]:
    headers = {"Accept": "text/event-stream", "Idempotency-Key": idempotency_key}
    with c.stream("POST", INVOKE, json={"input": {"chunks": 1}}, headers=headers) as r:
        r.read()
        return r.status_code, r.headers.get("X-Thaw-Call-Id")


def _listed(c: httpx.Client, path: str) -> list[str]:
    r = c.get(path)
    assert r.status_code == 200, r.text
    return [call["call_id"] for call in r.json()]


def test_call_visibility_matrix(cp: ControlPlane) -> None:
    cp.worker()
    cp.deploy("echo")
    owner_key, other_key = cp.key("invoke"), cp.key("invoke", "deploy")
    deploy_key = cp.key("deploy")
    with (
        cp.client(owner_key) as owner,
        cp.client(other_key) as other,
        cp.client() as admin,
        cp.client(deploy_key) as deploy_only,
    ):
        call_id = _start_call(owner, "order-1")
        _wait_status(owner, call_id, "running")
        missing = "c" * len(call_id)

        # get: the owner and an admin; another key hears what a missing id answers.
        assert owner.get(f"/v1/calls/{call_id}").json()["call_id"] == call_id
        assert admin.get(f"/v1/calls/{call_id}").json()["call_id"] == call_id
        hidden, absent = other.get(f"/v1/calls/{call_id}"), other.get(f"/v1/calls/{missing}")
        assert (hidden.status_code, absent.status_code) == (404, 404)
        assert hidden.json()["detail"] == f"no call {call_id!r}"
        # A key of another scope hears the same 403 for a real and a missing id.
        forbidden = deploy_only.get(f"/v1/calls/{call_id}")
        assert forbidden.status_code == 403
        assert forbidden.json() == deploy_only.get(f"/v1/calls/{missing}").json()

        # list: a key lists its own calls; an admin key, every key's.
        assert _listed(owner, "/v1/calls") == [call_id]
        assert _listed(admin, "/v1/calls?function=echo") == [call_id]
        assert _listed(other, "/v1/calls") == []
        assert deploy_only.get("/v1/calls").status_code == 403
        assert _listed(admin, "/v1/functions/echo/calls") == [call_id]
        assert _listed(other, "/v1/functions/echo/calls") == []

        # stream: the same Idempotency-Key from another key makes that key's own call.
        status, streamed_id = _stream_call_id(other, "order-1")
        assert status == 200 and streamed_id not in (None, call_id)
        assert deploy_only.post(INVOKE, json={"input": 1}).status_code == 403
        assert _listed(other, "/v1/calls") == [streamed_id]
        assert call_id not in _listed(other, "/v1/functions/echo/calls")

        # cancel: another key cannot, and learns nothing; the owner and an admin can.
        assert other.delete(f"/v1/calls/{call_id}").status_code == 404
        assert deploy_only.delete(f"/v1/calls/{call_id}").status_code == 403
        assert owner.get(f"/v1/calls/{call_id}").json()["status"] == "running"
        assert admin.delete(f"/v1/calls/{call_id}").json()["status"] == "cancelled"
        assert owner.delete(f"/v1/calls/{call_id}").json()["status"] == "cancelled"


# (method, path, bad body, the scopes of a key that may not use the operation, its function)
BAD_BODIES: list[tuple[str, str, bytes, tuple[str, ...], str | None]] = [
    ("POST", INVOKE, b'{"input": 1, "bogus": 2}', ("deploy",), None),
    ("POST", INVOKE, b"{not json", ("deploy",), None),
    ("POST", INVOKE, b"[]", ("invoke",), "other"),
    ("POST", "/v1/functions", b'{"name": 5}', ("invoke",), None),
    ("POST", "/v1/functions/echo/rollback", b'{"version": "x"}', ("deploy",), "other"),
    ("PATCH", "/v1/functions/echo/scaling", b"[]", ("invoke",), None),
    ("POST", "/v1/keys", b'{"scopes": ["root"]}', ("deploy", "invoke"), None),
    ("PUT", "/v1/secrets/token", b"{}", ("invoke",), None),
    ("POST", "/v1/workers/register", b"{", ("invoke",), None),
    ("POST", "/v1/calls/c1/events", b'{"kind": 1}', ("invoke", "deploy"), None),
]


@pytest.mark.parametrize(("method", "path", "body", "scopes", "function"), BAD_BODIES)
def test_wrong_scope_with_a_bad_body_is_403_not_422(
    cp: ControlPlane,
    method: str,
    path: str,
    body: bytes,
    scopes: tuple[str, ...],
    function: str | None,
) -> None:
    cp.deploy("echo")
    headers = {"content-type": "application/json"}
    with cp.client(cp.key(*scopes, function=function)) as c:
        r = c.request(method, path, content=body, headers=headers)
        assert r.status_code == 403, r.text
    assert httpx.request(method, cp.base_url + path, content=body).status_code == 401
    with cp.client() as admin:  # a key that may: its bad body is 422 as before
        assert admin.request(method, path, content=body, headers=headers).status_code == 422
