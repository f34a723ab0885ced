"""Worker agents: register, heartbeat, and report replica events."""

from __future__ import annotations

from fastapi import APIRouter, Response

from control_plane.api.deps import InvocationsDep, PrincipalDep
from control_plane.api.scopes import ScopeFirstRoute, needs
from control_plane.protocol import (
    HeartbeatReply,
    ReplicaEvent,
    WorkerHeartbeat,
    WorkerRegister,
    WorkerRegistered,
)

router = APIRouter(tags=["workers"], route_class=ScopeFirstRoute)


@router.post("/v1/workers/register", openapi_extra=needs("worker"))
def register(msg: WorkerRegister, who: PrincipalDep, inv: InvocationsDep) -> WorkerRegistered:
    who.require("worker")
    return inv.register(msg)


@router.post("/v1/workers/{worker_id}/heartbeat", openapi_extra=needs("worker"))
def heartbeat(
    worker_id: str, msg: WorkerHeartbeat, who: PrincipalDep, inv: InvocationsDep
) -> HeartbeatReply:
    who.require("worker")
    return inv.heartbeat(worker_id, msg)


@router.post("/v1/replicas/{replica_id}/events", status_code=200, openapi_extra=needs("worker"))
def replica_event(
    replica_id: str, ev: ReplicaEvent, who: PrincipalDep, inv: InvocationsDep
) -> Response:
    who.require("worker")
    inv.replica_event(replica_id, ev)
    return Response(status_code=200)
