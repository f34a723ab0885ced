"""Functions: deploy a version, list, show, delete, roll back."""

from __future__ import annotations

from fastapi import APIRouter, Query

from control_plane.api.deps import InvocationsDep, PrincipalDep, ServicesDep
from control_plane.api.schemas import FunctionPublic, RollbackBody
from control_plane.api.scopes import ScopeFirstRoute, needs
from control_plane.services import functions, secrets
from control_plane.spec import FunctionSpec

router = APIRouter(prefix="/v1/functions", tags=["functions"], route_class=ScopeFirstRoute)


@router.post("", status_code=201, openapi_extra=needs("deploy"))
def deploy(
    spec: FunctionSpec,
    who: PrincipalDep,
    services: ServicesDep,
    inv: InvocationsDep,
    canary_pct: float | None = Query(
        default=None, gt=0, lt=100, description="deploy as a canary taking this % of calls"
    ),
) -> FunctionPublic:
    """Check the spec (model, adapters, bundle import) and make it the active version,
    or, with ``canary_pct``, the canary beside it (``/v1/functions/{name}/canary``)."""
    who.require("deploy", spec.name)
    with services.db.session() as s:
        secrets.require_set(s, spec.secrets, spec.name)
        info = functions.deploy(
            s, services.registry, services.validate_bundle, spec, services.clock(), canary_pct
        )
    inv.reconciler.kick(spec.name)
    return FunctionPublic.of(info)


@router.get("")
def list_functions(who: PrincipalDep, services: ServicesDep) -> list[FunctionPublic]:
    who.require("deploy")
    with services.db.session() as s:
        infos = functions.list_functions(s)
    return [FunctionPublic.of(f) for f in infos if who.function in (None, f.name)]


@router.get("/{name}")
def show_function(name: str, who: PrincipalDep, services: ServicesDep) -> FunctionPublic:
    who.require("deploy", name)
    with services.db.session() as s:
        return FunctionPublic.of(functions.show(s, name))


@router.delete("/{name}", status_code=204)
def delete_function(
    name: str, who: PrincipalDep, services: ServicesDep, inv: InvocationsDep
) -> None:
    who.require("deploy", name)
    with services.db.session() as s:
        cancelled = functions.delete(s, services.registry, name, services.clock())
    for call_id in cancelled:
        services.notifier.notify(call_id)


@router.post("/{name}/rollback", openapi_extra=needs("deploy", function_param="name"))
def rollback(
    name: str, body: RollbackBody, who: PrincipalDep, services: ServicesDep, inv: InvocationsDep
) -> FunctionPublic:
    who.require("deploy", name)
    with services.db.session() as s:
        info = functions.rollback(s, name, body.version)
    inv.reconciler.kick(name)
    return FunctionPublic.of(info)
