"""API keys (admin only): create (token shown once), list, revoke."""

from __future__ import annotations

from fastapi import APIRouter

from control_plane.api.deps import PrincipalDep, ServicesDep
from control_plane.api.schemas import KeyCreate, KeyCreated, KeyPublic
from control_plane.api.scopes import ScopeFirstRoute, needs
from control_plane.services import keys
from control_plane.services.ratelimit import key_limit

router = APIRouter(prefix="/v1/keys", tags=["keys"], route_class=ScopeFirstRoute)


@router.post("", status_code=201, openapi_extra=needs("admin"))
def create_key(body: KeyCreate, who: PrincipalDep, services: ServicesDep) -> KeyCreated:
    who.require("admin")
    with services.db.session() as s:
        rate = key_limit(body.rate_per_s, body.rate_burst)
        token, info = keys.create_key(
            s, services.clock(), body.scopes, body.name, body.function, rate
        )
    return KeyCreated(token=token, **KeyPublic.of(info).model_dump())


@router.get("")
def list_keys(who: PrincipalDep, services: ServicesDep) -> list[KeyPublic]:
    who.require("admin")
    with services.db.session() as s:
        return [KeyPublic.of(k) for k in keys.list_keys(s)]


@router.delete("/{key_id}")
def revoke_key(key_id: str, who: PrincipalDep, services: ServicesDep) -> KeyPublic:
    who.require("admin")
    with services.db.session() as s:
        revoked = KeyPublic.of(keys.revoke_key(s, key_id, services.clock()))
    if services.principals is not None:
        services.principals.drop(key_id)
    if services.revocations is not None:  # the server's other processes forget it too
        services.revocations.send(key_id)
    return revoked
