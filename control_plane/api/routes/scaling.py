"""Operating a deployed function: edit its scaling, warm it up.

PATCH /v1/functions/{name}/scaling   ScalingPatch → FunctionPublic (active version
                                     edited; fields not sent keep their values;
                                     an invalid merged scaling is 422)
POST  /v1/functions/{name}/warm      {"replicas": N}? → WarmPublic (starts replicas
                                     until N, default 1, are live)
"""

from __future__ import annotations

from fastapi import APIRouter

from control_plane.api.deps import InvocationsDep, PrincipalDep, ServicesDep
from control_plane.api.schemas import FunctionPublic
from control_plane.api.schemas_console import WarmPublic, WarmRequest
from control_plane.api.scopes import ScopeFirstRoute, needs
from control_plane.services import scaling
from control_plane.spec import ScalingPatch

router = APIRouter(prefix="/v1/functions", tags=["scaling"], route_class=ScopeFirstRoute)


@router.patch("/{name}/scaling", openapi_extra=needs("deploy", function_param="name"))
def update_scaling(
    name: str, body: ScalingPatch, who: PrincipalDep, services: ServicesDep, inv: InvocationsDep
) -> FunctionPublic:
    who.require("deploy", name)
    with services.db.session() as s:
        info = scaling.update_scaling(s, name, body)
    inv.reconciler.kick(name)
    return FunctionPublic.of(info)


@router.post("/{name}/warm", status_code=202, openapi_extra=needs("deploy", function_param="name"))
def warm(
    name: str, who: PrincipalDep, services: ServicesDep, body: WarmRequest | None = None
) -> WarmPublic:
    who.require("deploy", name)
    r = scaling.warm(services, name, (body or WarmRequest()).replicas)
    return WarmPublic(
        function=r.function,
        started_replica_id=r.started_replica_id,
        started_replica_ids=r.started_replica_ids,
        live_replicas=r.live_replicas,
        requested_replicas=r.requested_replicas,
    )
