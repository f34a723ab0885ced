"""Invoking a function: synchronous, asynchronous (``Prefer: respond-async``), or SSE.

    200  succeeded (sync)           500  the function failed
    202  accepted (async)           504  deadline passed (phases so far in the body)
    409  cancelled, or an Idempotency-Key reused with another input

Every response carries ``X-Thaw-Call-Id``, ``X-Thaw-Cold`` and ``Server-Timing``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Annotated

from fastapi import APIRouter, Header
from fastapi.responses import JSONResponse, StreamingResponse

from control_plane.api.deps import InvocationsDep, PrincipalDep
from control_plane.api.schemas import CallAccepted, CallPublic, InvokeBody
from control_plane.api.timing import headers_for
from control_plane.services.activator import StreamItem, wait_dispatched
from control_plane.services.calls import CallRequest, CallView

router = APIRouter(prefix="/v1/functions", tags=["invoke"])

STATUS_BY_FINAL = {"succeeded": 200, "failed": 500, "timeout": 504, "cancelled": 409}


def final_response(view: CallView, since: float) -> JSONResponse:
    body = CallPublic.of(view).model_dump(mode="json")
    status = STATUS_BY_FINAL.get(view.status, 200)
    return JSONResponse(body, status, headers=headers_for(view, since))


@router.post(
    "/{name}/invoke",
    response_model=None,
    responses={200: {"model": CallPublic}, 202: {"model": CallAccepted}},
)
def invoke(
    name: str,
    body: InvokeBody,
    who: PrincipalDep,
    inv: InvocationsDep,
    prefer: Annotated[str | None, Header()] = None,
    accept: Annotated[str | None, Header()] = None,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
    x_thaw_deadline_ms: Annotated[float | None, Header(gt=0, le=86_400_000)] = None,
) -> JSONResponse | StreamingResponse:
    since = time.perf_counter()
    stream = accept is not None and "text/event-stream" in accept
    req = CallRequest(body.input, body.adapter, stream, idempotency_key, x_thaw_deadline_ms)
    view, _ = inv.invoke(who, name, req)
    if prefer is not None and "respond-async" in prefer:
        accepted = CallAccepted(call_id=view.id, status=view.status).model_dump()
        headers = {**headers_for(view, since), "Location": f"/v1/calls/{view.id}"}
        return JSONResponse(accepted, 202, headers=headers)
    if stream:
        view = wait_dispatched(inv.activator, view.id)
        items = inv.activator.stream(view.id)
        return StreamingResponse(
            _sse(items), media_type="text/event-stream", headers=headers_for(view, since)
        )
    return final_response(inv.activator.wait_final(view.id), since)


def _sse(items: Iterator[StreamItem]) -> Iterator[bytes]:
    for item in items:
        data = item.data
        if item.kind != "output" and item.call is not None:
            data = CallPublic.of(item.call).model_dump(mode="json")
        yield f"event: {item.kind}\ndata: {json.dumps(data)}\n\n".encode()
