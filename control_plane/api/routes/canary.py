"""Canary versions: status side by side, promote, abort (``services.canary``).

A canary is deployed with ``POST /v1/functions?canary_pct=10``.
"""

from __future__ import annotations

from fastapi import APIRouter, Query

from control_plane.api.deps import InvocationsDep, PrincipalDep, ServicesDep
from control_plane.api.schemas import FunctionPublic
from control_plane.api.schemas_canary import CanaryStatusPublic
from control_plane.services import canary

router = APIRouter(prefix="/v1/functions", tags=["canary"])


@router.get("/{name}/canary")
def canary_status(
    name: str,
    who: PrincipalDep,
    services: ServicesDep,
    window: int = Query(default=canary.DEFAULT_WINDOW, ge=1, le=100_000),
) -> CanaryStatusPublic:
    """The active version and the canary over the same calls window (since the canary began)."""
    who.require("deploy", name)
    with services.db.session() as s:
        return CanaryStatusPublic.of(canary.status(s, name, window))


@router.post("/{name}/canary/promote")
def promote(
    name: str, who: PrincipalDep, services: ServicesDep, inv: InvocationsDep
) -> FunctionPublic:
    """Make the canary the active version; the old version's replicas drain."""
    who.require("deploy", name)
    with services.db.session() as s:
        info = canary.promote(s, name)
    inv.reconciler.kick(name)
    return FunctionPublic.of(info)


@router.post("/{name}/canary/abort")
def abort(
    name: str, who: PrincipalDep, services: ServicesDep, inv: InvocationsDep
) -> FunctionPublic:
    """Drop the canary: every new call goes to the active version; its replicas drain."""
    who.require("deploy", name)
    with services.db.session() as s:
        info = canary.abort(s, name)
    inv.reconciler.kick(name)
    return FunctionPublic.of(info)
