"""Calls: look one up, cancel one; and the worker's call events."""

from __future__ import annotations

import time

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse

from control_plane.api.deps import InvocationsDep, PrincipalDep
from control_plane.api.schemas import CallPublic
from control_plane.api.timing import headers_for
from control_plane.protocol import CallEvent

router = APIRouter(prefix="/v1/calls", tags=["calls"])


@router.get("/{call_id}", response_model=CallPublic)
def get_call(call_id: str, who: PrincipalDep, inv: InvocationsDep) -> JSONResponse:
    since = time.perf_counter()
    view = inv.get(who, call_id)
    body = CallPublic.of(view).model_dump(mode="json")
    return JSONResponse(body, headers=headers_for(view, since))


@router.delete("/{call_id}", response_model=CallPublic)
def cancel_call(call_id: str, who: PrincipalDep, inv: InvocationsDep) -> JSONResponse:
    """Cancel unless already final; answers the call's (now) final state."""
    since = time.perf_counter()
    view = inv.cancel(who, call_id)
    body = CallPublic.of(view).model_dump(mode="json")
    return JSONResponse(body, headers=headers_for(view, since))


@router.post("/{call_id}/events", status_code=200, responses={409: {"description": "final"}})
def call_event(call_id: str, ev: CallEvent, who: PrincipalDep, inv: InvocationsDep) -> Response:
    """A worker reports progress or the end of a call (409 once final: stop sending)."""
    who.require("worker")
    inv.call_event(call_id, ev)
    return Response(status_code=200)
