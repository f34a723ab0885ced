"""The common invoke, served in front of the framework.

Most calls are the same request: a synchronous ``POST
/v1/functions/{name}/invoke`` with a JSON body, by a key verified a moment
ago. FastAPI spends about 2 ms of CPU on each before the call starts (route
matching across every route, dependency solving, a body read and a send
wrapper per middleware layer), as much as the call itself costs thaw. This
ASGI layer, outermost, serves exactly those requests:

- ``POST`` to the invoke path, neither ``Prefer: respond-async`` nor
  ``Accept: text/event-stream``;
- a bearer token this process verified within ``THAW_AUTH_CACHE_TTL_S``
  (``keys.PrincipalCache``), for a function whose rate limit it has loaded;
- a declared ``Content-Length`` within ``THAW_MAX_BODY_BYTES`` and
  ``application/json``; a body nested within ``THAW_MAX_BODY_DEPTH``
  (``invoke_body``), and a body and headers that validate.

Anything else goes on to the app unchanged, with the body replayed when it was
read, so ``routes.invoke`` stays the one reference for status codes and error
bodies. A request taken here runs the route's own code (``invoke_sync``, the
rate-limit charge) and answers errors through the app's own mapping
(``errors.response_for``), so the two paths cannot answer differently.

The OpenAI completion routes (``POST /openai/v1/chat/completions`` and
``/completions``, streamed or not) with a declared ``Content-Length`` within
``THAW_MAX_BODY_BYTES`` are served here too, by the route's own function
(``routes.openai.serve``), which answers every error itself: the layers skipped
cost about 0.3 ms before the call is accepted and more on the first token's write.
"""

from __future__ import annotations

import json
import re
import time

from pydantic import ValidationError
from starlette.datastructures import State
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from control_plane.api import errors
from control_plane.api.invoke_body import deeper_than
from control_plane.api.invoke_threads import on_invoke_threads
from control_plane.api.rate_limits import charge_if_known
from control_plane.api.routes import openai
from control_plane.api.routes.invoke import (
    MAX_DEADLINE_MS,
    MAX_IDEMPOTENCY_KEY,
    MAX_SESSION,
    invoke_sync,
)
from control_plane.api.schemas import InvokeBody
from control_plane.services.calls import CallRequest
from control_plane.services.keys import Principal, PrincipalCache

_PATH = re.compile(r"/v1/functions/([^/]+)/invoke")
_DEADLINE = re.compile(rb"[0-9]+(\.[0-9]+)?")
_BEARER = b"bearer "


class FastInvoke:
    """Wraps the app's whole middleware stack (``app.ControlPlaneApp``); what a request
    needs is read from the app's state (``scope["app"]``) at each request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope.get("root_path"):
            await self.app(scope, receive, send)
            return
        state = scope["app"].state
        completion = openai.KINDS.get(scope["path"])
        if completion is not None and _sized(scope, state):
            await openai.serve(scope, receive, send, completion)
            return
        match = _PATH.fullmatch(scope["path"])
        taken = _take(scope, state) if match else None
        if match is None or taken is None:
            await self.app(scope, receive, send)
            return
        name = match.group(1)
        who, headers = taken
        body = await _read_body(receive)
        if body is None:
            return  # the client went away before its body arrived
        req = _request(body, headers, state.services.settings.max_body_depth)
        if req is None:  # not valid: the app says what is wrong
            await self.app(scope, _replay(body, receive), send)
            return
        since = time.perf_counter()
        start_s = time.time()
        try:
            if not charge_if_known(state.rate_limiter, who, name):
                await self.app(scope, _replay(body, receive), send)
                return
            args = (state.invocations, who, name, req, since, start_s)
            response: Response = await on_invoke_threads(state, invoke_sync, *args)
        except errors.HANDLED as exc:
            response = errors.response_for(exc)
        await response(scope, receive, send)


def _sized(scope: Scope, state: State) -> bool:
    """Whether the request declares a body within ``THAW_MAX_BODY_BYTES`` (the server
    holds it to that length); a body of no declared length meets the app's limit."""
    for k, v in scope["headers"]:
        if k == b"content-length":
            return v.isdigit() and int(v) <= state.services.settings.max_body_bytes
    return False


def _take(scope: Scope, state: State) -> tuple[Principal, dict[bytes, bytes]] | None:
    """(the key's principal, the headers) when this layer can serve the request;
    None: the app serves it."""
    headers: dict[bytes, bytes] = {}
    for k, v in scope["headers"]:
        headers.setdefault(k, v)
    if b"respond-async" in headers.get(b"prefer", b""):
        return None
    if b"text/event-stream" in headers.get(b"accept", b""):
        return None
    if not headers.get(b"content-type", b"").startswith(b"application/json"):
        return None
    length = headers.get(b"content-length", b"")
    if not length.isdigit() or int(length) > state.services.settings.max_body_bytes:
        return None
    auth = headers.get(b"authorization", b"")
    if auth[: len(_BEARER)].lower() != _BEARER:
        return None
    cache: PrincipalCache | None = state.services.principals
    who = cache.get(auth[len(_BEARER) :].decode("latin-1")) if cache is not None else None
    if who is None:
        return None
    return who, headers


async def _read_body(receive: Receive) -> bytes | None:
    """The whole body (the server holds it to its declared length); None when the
    client left before it arrived."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """``receive`` as if the body had not been read yet."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replayed


def _request(body: bytes, headers: dict[bytes, bytes], max_depth: int) -> CallRequest | None:
    """The call the request asks for; None when the body or a header is not valid."""
    if deeper_than(body, max_depth):
        return None
    try:
        parsed = InvokeBody.model_validate(json.loads(body))
        idempotency_key = _text(headers.get(b"idempotency-key"), 0, MAX_IDEMPOTENCY_KEY)
        session = _text(headers.get(b"x-thaw-session"), 1, MAX_SESSION)
        deadline_ms = _deadline(headers.get(b"x-thaw-deadline-ms"))
    except (ValueError, ValidationError, RecursionError):
        return None
    return CallRequest(parsed.input, parsed.adapter, False, idempotency_key, deadline_ms, session)


def _text(raw: bytes | None, least: int, most: int) -> str | None:
    if raw is None:
        return None
    text = raw.decode("latin-1")
    if not least <= len(text) <= most:
        raise ValueError(text)
    return text


def _deadline(raw: bytes | None) -> float | None:
    if raw is None:
        return None
    if not _DEADLINE.fullmatch(raw) or not 0 < float(raw) <= MAX_DEADLINE_MS:
        raise ValueError(raw)
    return float(raw)
