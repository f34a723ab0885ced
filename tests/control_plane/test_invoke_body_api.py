"""Invoke bodies refused before a call is accepted (issue 24): nested past
``THAW_MAX_BODY_DEPTH``, over ``THAW_MAX_BODY_BYTES`` when chunked, not sent as
JSON. Each is a 4xx naming what to change, on the fast path (``api.fast_invoke``)
and through the app, for synchronous, asynchronous and streaming calls; no call
is recorded, and the next good call is served."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import httpx
import pytest
import sqlalchemy as sa

from control_plane.db.models import Call
from tests.control_plane.conftest import ControlPlane
from tests.faults.security_http import recorded_calls

MAX_BODY_BYTES = 300_000
MODES = {
    "sync": {},
    "async": {"Prefer": "respond-async"},
    "stream": {"Accept": "text/event-stream"},
}


def nested(depth: int) -> bytes:
    """``{"input": {"x": [[...]]}}``, ``depth`` levels in all."""
    return b'{"input": {"x": ' + b"[" * (depth - 2) + b"]" * (depth - 2) + b"}}"


def chunked(body: bytes) -> Iterator[bytes]:
    """The body as a chunked upload (no Content-Length)."""
    for at in range(0, len(body), 64 << 10):
        yield body[at : at + 64 << 10]


FINAL = {"succeeded", "failed", "timeout", "expired", "cancelled"}
JSON = {"Content-Type": "application/json"}
BAD_BODIES: dict[str, tuple[Callable[[], object], dict[str, str], int, str]] = {
    "300 deep": (lambda: nested(300), JSON, 400, "(THAW_MAX_BODY_DEPTH)"),
    "900 deep": (lambda: nested(900), JSON, 400, "(THAW_MAX_BODY_DEPTH)"),
    "100000 deep": (lambda: nested(100_000), JSON, 400, "(THAW_MAX_BODY_DEPTH)"),
    "oversize, chunked": (
        lambda: chunked(b'{"input": "' + b"z" * MAX_BODY_BYTES + b'"}'),
        JSON,
        413,
        f"exceeds {MAX_BODY_BYTES} bytes (THAW_MAX_BODY_BYTES)",
    ),
    "not JSON": (lambda: b'{"input": 1}', {"Content-Type": "text/plain"}, 415, "application/json"),
}


def good_call_is_served(c: httpx.Client, mode: str) -> None:
    path = "/v1/functions/echo/invoke"
    if mode == "stream":
        with c.stream("POST", path, json={"input": {"chunks": 2}}, headers=MODES[mode]) as r:
            assert r.status_code == 200
            assert "event: done" in "".join(r.iter_text())
        return
    r = c.post(path, json={"input": {"x": 1}}, headers=MODES[mode])
    if mode == "async":
        assert r.status_code == 202, r.text
        call_id = r.json()["call_id"]
        deadline = time.monotonic() + 10
        while (r := c.get(f"/v1/calls/{call_id}")).json()["status"] not in FINAL:
            assert time.monotonic() < deadline, r.text
            time.sleep(0.02)
    assert r.status_code == 200 and r.json()["status"] == "succeeded", r.text


@pytest.mark.parametrize("path", ["fast", "app"])
def test_bad_bodies_are_named_4xx_and_the_next_call_is_served(
    cp_factory: Callable[..., ControlPlane], path: str
) -> None:
    # ``app``: no verified key is kept, so the fast layer never serves a call.
    ttl = {"auth_cache_ttl_s": 0} if path == "app" else {}
    cp = cp_factory(max_body_bytes=MAX_BODY_BYTES, **ttl)
    cp.worker()
    cp.deploy("echo", scaling={"min_replicas": 1, "max_replicas": 1, "target_concurrency": 1})
    good = 0
    with cp.client() as c:
        good_call_is_served(c, "sync")  # the replica is up; the key and its limit are known
        good += 1
        for mode, headers in MODES.items():
            for what, (body, content_type, status, named) in BAD_BODIES.items():
                r = c.post(
                    "/v1/functions/echo/invoke",
                    content=body(),  # type: ignore[arg-type]
                    headers={**headers, **content_type},
                )
                assert (r.status_code, named in r.json()["detail"]) == (status, True), (
                    mode,
                    what,
                    r.text,
                )
            good_call_is_served(c, mode)
            good += 1
    assert recorded_calls(cp, "echo") == good


def test_a_call_whose_message_cannot_be_encoded_ends_failed_once(
    cp_factory: Callable[..., ControlPlane],
) -> None:
    """A stored input nested past what a message encodes (one accepted before
    ``THAW_MAX_BODY_DEPTH`` was checked): its call ends failed when it is sent, not
    left dispatched, and the next call is served."""
    cp = cp_factory()
    cp.deploy("echo")
    with cp.client() as c:
        r = c.post("/v1/functions/echo/invoke", json={"input": 1}, headers=MODES["async"])
        call_id = r.json()["call_id"]  # queued: no worker yet
        engine = sa.create_engine(cp.settings.database_url_resolved())
        with engine.begin() as conn:
            deep = "[" * 300 + "]" * 300
            conn.execute(sa.update(Call).where(Call.id == call_id).values(input_json=deep))
        engine.dispose()
        cp.worker()
        deadline = time.monotonic() + 10
        while (r := c.get(f"/v1/calls/{call_id}")).json()["status"] not in FINAL:
            assert time.monotonic() < deadline, r.text
            time.sleep(0.02)
        assert r.json()["status"] == "failed" and r.json()["attempt"] == 1
        assert "could not be encoded" in r.json()["error"]
        good_call_is_served(c, "sync")
