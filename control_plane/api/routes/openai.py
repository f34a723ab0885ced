"""OpenAI-compatible routes over LLM functions, under ``/openai/v1`` (thaw's own
``/v1/models`` lists the store, so these take a prefix of their own)::

    GET  /openai/v1/models              one entry per LLM function and function:adapter
    POST /openai/v1/chat/completions    messages → the model's chat template
    POST /openai/v1/completions         a plain prompt

A thaw key is the bearer token. Each request is one thaw call on the streaming
invoke path (router, activator, cold start from zero); a stream sends SSE comments
while its call waits for a replica, then the chunks, then ``data: [DONE]``. Every
error is OpenAI's error object with its status, so the ``openai`` SDK raises the
matching exception. A stream whose first event is a failure (a bad prompt on a warm
replica) still gets its status; one that fails after it began gets the error as an
event, as OpenAI sends it.

Thin on purpose: the wire format is ``control_plane.openai``.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from control_plane.api.deps import principal_of
from control_plane.api.disconnect import EventStream
from control_plane.api.errors import status_for
from control_plane.api.invoke_body import check
from control_plane.api.invoke_threads import on_invoke_threads
from control_plane.api.rate_limits import charge_if_known
from control_plane.api.timing import headers_for
from control_plane.errors import (
    ControlPlaneError,
    DeadlineExceededError,
    ForbiddenError,
    NotFoundError,
    RateLimitedError,
)
from control_plane.openai import calls
from control_plane.openai.errors import OpenAIError, invalid
from control_plane.openai.protocol import ChatCompletionRequest, CompletionRequest, parse_request
from control_plane.services.activator import StreamItem
from control_plane.services.calls import CallRequest, CallView
from control_plane.services.functions import ActiveVersion
from control_plane.services.invocations import Invocations
from control_plane.services.keys import Principal
from control_plane.services.ratelimit import RateLimiter, retry_after_header

router = APIRouter(prefix="/openai/v1", tags=["openai"])

T = TypeVar("T")

#: How long a stream waits for its first event before it sends the status and then
#: an SSE comment each time this passes with nothing to send (a cold start).
KEEPALIVE_S = 1.0


@router.get("/models")
async def list_models(request: Request) -> Response:
    try:
        who = await principal_of(request)
        inv: Invocations = request.app.state.invocations
        models = await _off_loop(request, _models, inv, who)
    except (ControlPlaneError, OpenAIError) as exc:
        return error_response(exc)
    return JSONResponse(models)


def _models(inv: Invocations, who: Principal) -> dict[str, Any]:
    with inv.s.db.session() as session:
        return calls.model_list(session, who, inv.versions).model_dump(mode="json")


_CHAT, _TEXT = "/chat/completions", "/completions"

#: The completion routes by path, as ``serve`` takes them.
KINDS: dict[str, type[ChatCompletionRequest] | type[CompletionRequest]] = {
    router.prefix + _CHAT: ChatCompletionRequest,
    router.prefix + _TEXT: CompletionRequest,
}


async def serve(
    scope: Scope,
    receive: Receive,
    send: Send,
    kind: type[ChatCompletionRequest] | type[CompletionRequest],
) -> None:
    """A completion request served in front of the framework (``api.fast_invoke``): the
    route's own code, without the router's matching and the middleware layers' wrappers
    on every message, on the way to its first token and after it."""
    response = await _generate(Request(scope, receive), kind)
    await response(scope, receive, send)


@router.post(_CHAT)
async def chat_completions(request: Request) -> Response:
    return await _generate(request, ChatCompletionRequest)


@router.post(_TEXT)
async def completions(request: Request) -> Response:
    return await _generate(request, CompletionRequest)


async def _generate(
    request: Request, kind: type[ChatCompletionRequest] | type[CompletionRequest]
) -> Response:
    since = time.perf_counter()
    inv: Invocations = request.app.state.invocations
    try:
        who = await principal_of(request)
        body = await _body(request)
        parsed = parse_request(kind, body)
        limiter = request.app.state.rate_limiter
        if not parsed.stream:
            return await _off_loop(request, _complete, inv, limiter, who, parsed, since)
        view = await _off_loop(request, _accept, inv, limiter, who, parsed)
        batches = inv.activator.astream(view.id, KEEPALIVE_S, view.deadline_at)
        first = await _first_batch(batches)
        if view.status == "queued":  # cold or warm, if known by now
            view = await _off_loop(request, inv.get, who, view.id)
        if first[0].kind == "error":
            await batches.aclose()
            call_view = first[0].call
            error = _text(first[0].data)
            raise calls.failure(call_view, error, call_view.status if call_view else "")
    except (ControlPlaneError, OpenAIError) as exc:
        return error_response(exc)
    stream = calls.Stream(parsed, view.id)
    return EventStream(
        _events(stream, first, batches),
        lambda: inv.activator.client_gone(view.id),
        headers={**_stream_headers(view, since), "Cache-Control": "no-cache"},
    )


async def _off_loop(request: Request, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, blocking, on the invoke threads, as ``POST .../invoke`` uses: a
    third of anyio's cost per hop, on every request's way to its first token."""
    return await on_invoke_threads(request.app.state, fn, *args)


def _stream_headers(view: CallView, since: float) -> dict[str, str]:
    """The call's headers as the stream begins; a call still queued (a replica is
    starting) has no X-Thaw-Cold yet: its record says once it is known."""
    headers = headers_for(view, since)
    if view.status == "queued":
        del headers["X-Thaw-Cold"]
    return headers


async def _body(request: Request) -> Any:
    raw = await request.body()
    if not raw:
        raise invalid("the request has no body: send a JSON object")
    check(
        raw, request.headers.get("content-type"), request.app.state.services.settings.max_body_depth
    )
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise invalid(f"the request body is not JSON: {exc}") from None


def _accept(
    inv: Invocations,
    limiter: RateLimiter,
    who: Principal,
    parsed: ChatCompletionRequest | CompletionRequest,
    *,
    background: bool = True,
) -> CallView:
    """The call accepted on the function ``parsed.model`` names, in one transaction that
    also reads the model (``Invocations.invoke`` makes the call from the version it is
    accepted on), and in one trip off the event loop (blocking). The rate limits are
    charged as ``POST .../invoke`` charges them, once the model is one this key may call.
    ``background``: a warm call starts on a thread of its own and this returns at once."""
    who.require("invoke")  # a key that may call nothing learns nothing of names
    name = parsed.model.partition(":")[0]
    limiter.learn(name)  # read here (when not fresh), not in the accepting transaction

    def call(fn: ActiveVersion) -> CallRequest:
        target = calls.target_of(parsed.model, fn, inv.s.registry)
        if not charge_if_known(limiter, who, name):
            limiter.check(who.key_id, who.rate, name)
        return CallRequest(calls.call_input(parsed, target), target.adapter, parsed.stream)

    try:
        view, _ = inv.invoke(who, name, call, direct=True, background=background)
    except (NotFoundError, ForbiddenError, calls.UnknownModel):
        with inv.s.db.session() as session:
            raise calls.not_found(session, who, parsed.model, inv.versions) from None
    return view


def _complete(
    inv: Invocations,
    limiter: RateLimiter,
    who: Principal,
    parsed: ChatCompletionRequest | CompletionRequest,
    since: float,
) -> Response:
    """A call that is not streamed, start to end (blocking)."""
    view = _accept(inv, limiter, who, parsed, background=False)
    try:
        final = inv.activator.wait_final(view.id, view)
    except DeadlineExceededError as exc:
        raise OpenAIError(504, str(exc), None, "timeout") from None
    if final.status != "succeeded":
        raise calls.failure(final, final.error, final.status)
    body = calls.response(parsed, final).model_dump(mode="json")
    return JSONResponse(body, headers=headers_for(final, since))


async def _first_batch(batches: AsyncGenerator[list[StreamItem]]) -> list[StreamItem]:
    """The stream's first items (a stream always gives at least its end)."""
    async for batch in batches:
        if batch:
            return batch
    raise RuntimeError("a call's stream ended with no item")


async def _events(
    stream: calls.Stream, first: list[StreamItem], batches: AsyncGenerator[list[StreamItem]]
) -> AsyncIterator[bytes]:
    """The stream's SSE events: comments while waiting, chunks, then ``[DONE]``; the
    items that arrived together in one write."""
    async with contextlib.aclosing(batches):
        batch: list[StreamItem] | None = first
        while batch is not None:
            out, ended = _encode(stream, batch)
            if out:
                yield b"".join(out)
            if ended:
                return
            batch = await anext(batches, None)


def _encode(stream: calls.Stream, batch: list[StreamItem]) -> tuple[list[bytes], bool]:
    """A batch's events, and whether the stream ended with it."""
    out: list[bytes] = []
    for item in batch:
        if item.kind == "waiting":
            out.append(f": waiting for a replica (call {item.data})\n\n".encode())
        elif item.kind == "output":
            out.extend(stream.output(item.data))
        elif item.kind == "error":
            status = item.call.status if item.call is not None else ""
            out.append(calls.Stream.error(calls.failure(item.call, _text(item.data), status)))
            return out, True
        else:
            out.append(calls.DONE)
            return out, True
    return out, False


def _text(data: Any) -> str:
    return data if isinstance(data, str) else json.dumps(data)


def error_response(exc: Exception) -> JSONResponse:
    """``exc`` as OpenAI's error object (thaw's own errors keep their status)."""
    headers = {}
    if isinstance(exc, RateLimitedError):
        headers["Retry-After"] = retry_after_header(exc.retry_after_s)
    error = exc if isinstance(exc, OpenAIError) else OpenAIError(status_for(exc), str(exc))
    if error.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse(error.body(), error.status, headers=headers)
