"""The fast invoke layer (``api.fast_invoke``): which requests it serves itself,
that it passes every other one on with its body intact, and that what it
answers is what the app answers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.types import Message

from control_plane.api.app import create_app
from control_plane.api.fast_invoke import FastInvoke
from control_plane.dispatch.memory import InMemoryDispatcher
from control_plane.services.keys import Principal
from control_plane.services.ratelimit import Limit
from tests.control_plane.conftest import ControlPlane, StoreFixture, make_settings
from tests.control_plane.server import serve

PATH = "/v1/functions/echo/invoke"
TOKEN = "thaw_k1_secret"


@dataclass
class Exchange:
    """One request through the layer: what came back, and what the app behind it got."""

    status: int = 0
    body: bytes = b""
    passed_on: bool = False
    app_got: bytes = b""
    headers: dict[bytes, bytes] = field(default_factory=dict)


def _exchange(app: Any, body: bytes, headers: dict[str, str], path: str = PATH) -> Exchange:
    out = Exchange()

    async def app_behind(scope: Any, receive: Any, send: Any) -> None:
        out.passed_on = True
        more = True
        while more:  # the body, whether the layer read it first or not
            message = await receive()
            out.app_got += message["body"]
            more = message["more_body"]
        await send({"type": "http.response.start", "status": 299, "headers": []})
        await send({"type": "http.response.body", "body": b"app"})

    async def run() -> None:
        chunks = [body[: len(body) // 2], body[len(body) // 2 :]]  # a body in two messages

        async def receive() -> Message:
            chunk = chunks.pop(0) if chunks else None
            if chunk is None:
                await asyncio.sleep(3600)  # no disconnect while the call runs
            return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}

        async def send(message: Message) -> None:
            if message["type"] == "http.response.start":
                out.status = message["status"]
                out.headers = dict(message["headers"])
            else:
                out.body += message.get("body", b"")

        scope = {
            "type": "http",
            "method": "POST",
            "path": path,
            "root_path": "",
            "app": app,
            "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        }
        await FastInvoke(app_behind)(scope, receive, send)

    asyncio.run(run())
    return out


@pytest.fixture
def served_app(tmp_path: Path, cp_store: StoreFixture) -> Iterator[tuple[Any, httpx.Client]]:
    """An app with ``echo`` deployed (no worker, no reconcile loop; bodies of at most
    1000 bytes) and an admin client."""
    url = f"sqlite:///{tmp_path / 'thaw.db'}"
    settings = make_settings(tmp_path, url, cp_store.root, max_body_bytes=1000)
    app = create_app(settings, dispatcher=InMemoryDispatcher(), run_loop=False)
    with serve(app) as base_url:
        headers = {"Authorization": f"Bearer {app.state.bootstrap_admin_key}"}
        with httpx.Client(base_url=base_url, headers=headers, timeout=30) as c:
            spec = ControlPlane(base_url, "", InMemoryDispatcher(), settings, cp_store).spec()
            assert c.post("/v1/functions", json=spec).status_code == 201
            yield app, c


def test_serves_a_sync_call_by_a_verified_key_and_passes_on_the_rest(
    served_app: tuple[Any, httpx.Client],
) -> None:
    app, client = served_app
    services = app.state.services
    services.principals.put(TOKEN, Principal("k1", frozenset({"invoke"})))
    services.principals.put("thaw_k2_secret", Principal("k2", frozenset({"invoke"}), "other"))
    app.state.rate_limiter.check("k1", None, "echo")  # its limit is known from now on

    good = json.dumps({"input": {"x": 1}}).encode()
    auth = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    sized = {**auth, "Content-Length": str(len(good))}

    # Served here: the call is accepted, finds no replica, and expires at its deadline.
    ex = _exchange(app, good, {**sized, "X-Thaw-Deadline-Ms": "100"})
    assert not ex.passed_on and ex.status == 504, ex
    call_id = json.loads(ex.body)["call_id"]  # with the phases so far
    assert ex.headers[b"x-thaw-call-id"] == call_id.encode()
    assert client.get(f"/v1/calls/{call_id}").json()["status"] == "expired"

    # Served here too: errors, answered the way the app answers them.
    other = {**sized, "Authorization": "Bearer thaw_k2_secret"}
    ex = _exchange(app, good, other)
    assert (ex.passed_on, ex.status) == (False, 403) and b"limited to function" in ex.body
    slow = Limit(1e-6, 1)
    services.principals.put(TOKEN, Principal("k1", frozenset({"invoke"}), rate=slow))
    app.state.rate_limiter.check("k1", slow, "echo")  # its one token is spent
    ex = _exchange(app, good, sized)
    assert (ex.passed_on, ex.status) == (False, 429) and b"retry-after" in ex.headers

    # Passed on, body intact: what the app must judge or serve differently.
    bad = json.dumps({"input": 1, "bogus": 2}).encode()
    deep = b'{"input": ' + b"[" * 300 + b"]" * 300 + b"}"  # past THAW_MAX_BODY_DEPTH
    passed = {
        "an unverified key": (good, {**sized, "Authorization": "Bearer thaw_k9_other"}),
        "no key": (good, {"Content-Type": "application/json", "Content-Length": str(len(good))}),
        "async": (good, {**sized, "Prefer": "respond-async"}),
        "a stream": (good, {**sized, "Accept": "text/event-stream"}),
        "not JSON by its type": (good, {**sized, "Content-Type": "text/plain"}),
        "no declared length": (good, auth),
        "over the size limit": (b" " * 2000, {**auth, "Content-Length": "2000"}),
        "a body that does not validate": (bad, {**auth, "Content-Length": str(len(bad))}),
        "a body that is not JSON": (b"{", {**auth, "Content-Length": "1"}),
        "a body nested too deep": (deep, {**auth, "Content-Length": str(len(deep))}),
        "a deadline of 0": (good, {**sized, "X-Thaw-Deadline-Ms": "0"}),
        "a deadline that is no number": (good, {**sized, "X-Thaw-Deadline-Ms": "1e3"}),
        "an empty session": (good, {**sized, "X-Thaw-Session": ""}),
        "a long idempotency key": (good, {**sized, "Idempotency-Key": "k" * 201}),
    }
    for what, (body, headers) in passed.items():
        ex = _exchange(app, body, headers)
        assert (ex.passed_on, ex.status, ex.app_got) == (True, 299, body), what


def test_serves_the_openai_completion_routes_with_a_declared_length(
    served_app: tuple[Any, httpx.Client],
) -> None:
    app, _ = served_app
    services = app.state.services
    one_call = Limit(1e-6, 1)  # one token, never refilled in the test
    services.principals.put(TOKEN, Principal("k1", frozenset({"invoke"}), rate=one_call))
    services.principals.put("thaw_k2_secret", Principal("k2", frozenset({"invoke"}), "other"))
    chat = json.dumps({"model": "echo", "messages": [{"role": "user", "content": "Hi"}]}).encode()
    auth = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    sized = {**auth, "Content-Length": str(len(chat))}
    route = "/openai/v1/chat/completions"

    # Served here, by the route's own code: ``echo`` is no LLM function, so it is not
    # a model (OpenAI's 404, as the app answers it), and no request for it is charged
    # to the key's rate limit.
    for headers in (sized, sized, {**sized, "Authorization": "Bearer thaw_k2_secret"}):
        ex = _exchange(app, chat, headers, route)
        assert (ex.passed_on, ex.status) == (False, 404), ex
        assert json.loads(ex.body)["error"]["code"] == "model_not_found"
    ex = _exchange(app, b"{", {**auth, "Content-Length": "1"}, "/openai/v1/completions")
    assert (ex.passed_on, ex.status) == (False, 400) and b"not JSON" in ex.body

    # Passed on: a body of no declared length, or one over the size limit.
    passed = {
        "no declared length": (chat, auth),
        "over the size limit": (b" " * 2000, {**auth, "Content-Length": "2000"}),
    }
    for what, (body, headers) in passed.items():
        ex = _exchange(app, body, headers, route)
        assert (ex.passed_on, ex.status, ex.app_got) == (True, 299, body), what


def test_answers_bad_input_as_the_app_does(cp_factory: Callable[..., ControlPlane]) -> None:
    fast = cp_factory()
    plain = cp_factory(auth_cache_ttl_s=0)  # no verified keys kept: the layer never serves
    fast.deploy("echo")
    token = fast.key("invoke", function="other")
    nan = b'{"input": NaN}'
    deep = b'{"input": ' + b"[" * 299 + b"]" * 299 + b"}"
    cases: list[tuple[str, dict[str, Any]]] = [
        ("unknown function", {"url": "/v1/functions/nosuch/invoke", "json": {"input": 1}}),
        ("extra field", {"json": {"input": 1, "bogus": 2}}),
        ("unknown adapter", {"json": {"input": 1, "adapter": "nope:v1"}}),
        ("not strict JSON", {"content": nan, "headers": {"content-type": "application/json"}}),
        ("nested 300 deep", {"content": deep, "headers": {"content-type": "application/json"}}),
        (
            "not sent as JSON",
            {"content": b'{"input": 1}', "headers": {"content-type": "text/plain"}},
        ),
        ("deadline of 0", {"json": {"input": 1}, "headers": {"X-Thaw-Deadline-Ms": "0"}}),
        ("long key", {"json": {"input": 1}, "headers": {"Idempotency-Key": "k" * 201}}),
        ("key of another function", {"json": {"input": 1}, "token": token}),
    ]
    for what, case in cases:
        answers = []
        for cp in (fast, plain):
            with cp.client(case.get("token")) as c:
                c.get("/v1/functions")  # the key is verified (and kept, by ``fast``)
                kw = {k: v for k, v in case.items() if k in ("json", "content", "headers")}
                r = c.post(case.get("url", PATH), **kw)
                answers.append((r.status_code, r.json()))
        assert answers[0] == answers[1], what
        assert answers[0][0] in (400, 403, 404, 415, 422), (what, answers[0])
