"""Invoking a function: synchronous, asynchronous (``Prefer: respond-async``), or SSE.

    200  succeeded (sync)           500  the function failed
    202  accepted (async)           504  deadline passed (phases so far in the body):
                                         status timeout, or expired if it never left the queue
    409  cancelled, or an Idempotency-Key reused with another input

A call with ``X-Thaw-Session`` goes to the replica that served that session
last while it is ready and not overloaded (``services.router``).

Every response carries ``X-Thaw-Call-Id``, ``X-Thaw-Cold`` and ``Server-Timing``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Annotated

from fastapi import APIRouter, Header, Request
from fastapi.responses import JSONResponse, Response

from control_plane.api.deps import InvocationsDep, PrincipalDep
from control_plane.api.disconnect import EventStream
from control_plane.api.invoke_body import BodyCheckedRoute
from control_plane.api.schemas import CallAccepted, CallPublic, InvokeBody
from control_plane.api.scopes import ScopeFirstRoute, needs
from control_plane.api.timing import headers_for
from control_plane.services.activator import StreamItem, wait_dispatched
from control_plane.services.calls import CallRequest, CallView
from control_plane.services.invocations import Invocations
from control_plane.services.keys import Principal


class InvokeRoute(ScopeFirstRoute, BodyCheckedRoute):
    """The key's scope is checked first, then the body (JSON, nesting:
    ``api.invoke_body``), then FastAPI parses it."""


router = APIRouter(prefix="/v1/functions", tags=["invoke"], route_class=InvokeRoute)

STATUS_BY_FINAL = {
    "succeeded": 200,
    "failed": 500,
    "timeout": 504,
    "expired": 504,
    "cancelled": 409,
}


# Header limits, checked here and by ``api.fast_invoke`` alike.
MAX_IDEMPOTENCY_KEY = 200
MAX_DEADLINE_MS = 86_400_000
MAX_SESSION = 200
# Synchronous and streaming calls waiting at once, each holding a thread; past
# this, callers wait for one.
SYNC_THREADS = 256


def final_response(view: CallView, since: float) -> Response:
    """The call as it ended (pydantic writes the JSON: a third of ``JSONResponse``'s
    dump-then-encode)."""
    body = CallPublic.of(view).model_dump_json()
    status = STATUS_BY_FINAL.get(view.status, 200)
    return Response(body, status, headers_for(view, since), media_type="application/json")


def invoke_sync(
    inv: Invocations, who: Principal, name: str, req: CallRequest, since: float, start_s: float
) -> Response:
    """A synchronous call, start to end (blocking): the response with its final state.
    A warm call runs on this thread (the caller waits anyway)."""
    view, _ = inv.invoke(who, name, req, direct=True)
    response = final_response(inv.activator.wait_final(view.id, view), since)
    inv.trace_invoke(view.id, name, start_s, response.status_code, "sync")
    return response


@router.post(
    "/{name}/invoke",
    response_model=None,
    responses={200: {"model": CallPublic}, 202: {"model": CallAccepted}},
    openapi_extra=needs("invoke", function_param="name"),
)
def invoke(
    name: str,
    body: InvokeBody,
    who: PrincipalDep,
    inv: InvocationsDep,
    request: Request,
    prefer: Annotated[str | None, Header()] = None,
    accept: Annotated[str | None, Header()] = None,
    idempotency_key: Annotated[str | None, Header(max_length=MAX_IDEMPOTENCY_KEY)] = None,
    x_thaw_deadline_ms: Annotated[float | None, Header(gt=0, le=MAX_DEADLINE_MS)] = None,
    x_thaw_session: Annotated[str | None, Header(min_length=1, max_length=MAX_SESSION)] = None,
) -> Response:
    since = time.perf_counter()
    start_s = time.time()  # the trace's root span starts here
    stream = accept is not None and "text/event-stream" in accept
    req = CallRequest(
        body.input, body.adapter, stream, idempotency_key, x_thaw_deadline_ms, x_thaw_session
    )
    respond_async = prefer is not None and "respond-async" in prefer
    if not (respond_async or stream):
        return invoke_sync(inv, who, name, req, since, start_s)
    view, _ = inv.invoke(who, name, req)
    if respond_async:
        accepted = CallAccepted(call_id=view.id, status=view.status).model_dump()
        headers = {**headers_for(view, since), "Location": f"/v1/calls/{view.id}"}
        inv.trace_invoke(view.id, name, start_s, 202, "async")
        return JSONResponse(accepted, 202, headers=headers)
    view = wait_dispatched(inv.activator, view.id)
    items = inv.activator.stream(view.id)
    return EventStream(
        _sse(items, lambda: inv.trace_invoke(view.id, name, start_s, 200, "stream")),
        lambda: inv.activator.client_gone(view.id),
        headers=headers_for(view, since),
    )


def _sse(items: Iterator[StreamItem], done: Callable[[], None]) -> Iterator[bytes]:
    """The stream's events; ``done`` runs once it has ended (sent or abandoned)."""
    try:
        for item in items:
            data = item.data
            if item.kind != "output" and item.call is not None:
                data = CallPublic.of(item.call).model_dump(mode="json")
            yield f"event: {item.kind}\ndata: {json.dumps(data)}\n\n".encode()
    finally:
        done()
