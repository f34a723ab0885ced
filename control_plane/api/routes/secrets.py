"""Function secrets (scope ``deploy``): set, list names, remove. Values never come back."""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from control_plane.api.deps import PrincipalDep, ServicesDep
from control_plane.api.scopes import ScopeFirstRoute, needs
from control_plane.dispatch.secrets import SecretsDispatcher
from control_plane.services import secrets
from control_plane.services.secrets import MAX_VALUE_BYTES, SecretBox, SecretInfo

router = APIRouter(prefix="/v1/secrets", tags=["secrets"], route_class=ScopeFirstRoute)


class SecretSet(BaseModel):
    model_config = ConfigDict(extra="forbid")

    value: str = Field(min_length=1, max_length=MAX_VALUE_BYTES)


class SecretPublic(BaseModel):
    """What the API says of a secret: its name and times, never its value."""

    name: str
    created_at: float
    updated_at: float

    @classmethod
    def of(cls, info: SecretInfo) -> SecretPublic:
        return cls(name=info.name, created_at=info.created_at, updated_at=info.updated_at)


def _box(request: Request) -> SecretBox:
    # The app's dispatcher is always the one that fills StartReplica.secrets (api.app).
    dispatcher = request.app.state.services.dispatcher
    if not isinstance(dispatcher, SecretsDispatcher):
        raise RuntimeError("the app's dispatcher does not hold the secrets key")
    return dispatcher.box


@router.put("/{name}", openapi_extra=needs("deploy"))
def set_secret(
    name: str, body: SecretSet, who: PrincipalDep, services: ServicesDep, request: Request
) -> SecretPublic:
    who.require("deploy")
    with services.db.session() as s:
        info = secrets.set_secret(s, _box(request), name, body.value, services.clock())
    return SecretPublic.of(info)


@router.get("")
def list_secrets(who: PrincipalDep, services: ServicesDep) -> list[SecretPublic]:
    who.require("deploy")
    with services.db.session() as s:
        return [SecretPublic.of(i) for i in secrets.list_secrets(s)]


@router.delete("/{name}", status_code=204)
def delete_secret(name: str, who: PrincipalDep, services: ServicesDep) -> None:
    who.require("deploy")
    with services.db.session() as s:
        secrets.delete_secret(s, name)
