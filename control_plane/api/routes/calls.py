"""Calls: list them, look one up, cancel one; and the worker's call events.

A call is seen by the key that made it and by admin keys; any other key hears
404, as for a call that does not exist (``services.call_access``)."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Query, Response
from fastapi.responses import JSONResponse

from control_plane.api.deps import InvocationsDep, PrincipalDep
from control_plane.api.schemas import CallPublic
from control_plane.api.scopes import ScopeFirstRoute, needs
from control_plane.api.timing import headers_for
from control_plane.protocol import CallEvent
from control_plane.services.call_access import MAX_LISTED_CALLS

router = APIRouter(prefix="/v1/calls", tags=["calls"], route_class=ScopeFirstRoute)


@router.get("")
def list_calls(
    who: PrincipalDep,
    inv: InvocationsDep,
    function: Annotated[str | None, Query(min_length=1)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LISTED_CALLS)] = 100,
) -> list[CallPublic]:
    """The latest calls this key made (an admin key: every key's), newest first."""
    return [CallPublic.of(v) for v in inv.list_calls(who, function, limit)]


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


@router.post(
    "/{call_id}/events",
    status_code=200,
    responses={409: {"description": "final"}},
    openapi_extra=needs("worker"),
)
def call_event(call_id: str, ev: CallEvent, who: PrincipalDep, inv: InvocationsDep) -> Response:
    """A worker reports progress or the end of a call (409 once final: stop sending)."""
    who.require("worker")
    inv.call_event(call_id, ev)
    return Response(status_code=200)
