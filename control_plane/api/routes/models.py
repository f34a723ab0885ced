"""Models and adapters in the store: list, show, delete (refused while in use)."""

from __future__ import annotations

from fastapi import APIRouter

from control_plane.api.deps import PrincipalDep, ServicesDep
from control_plane.api.schemas import ModelPublic
from control_plane.services import catalog

router = APIRouter(prefix="/v1/models", tags=["models"])


@router.get("")
def list_models(who: PrincipalDep, services: ServicesDep) -> list[ModelPublic]:
    who.require("deploy")
    return [ModelPublic.of(a) for a in catalog.list_artifacts(services.registry)]


@router.get("/{ref:path}")
def show_model(ref: str, who: PrincipalDep, services: ServicesDep) -> ModelPublic:
    """``ref`` is ``NAME:TAG`` (names may contain ``/``)."""
    who.require("deploy")
    return ModelPublic.of(catalog.show_artifact(services.registry, ref))


@router.delete("/{ref:path}")
def delete_model(ref: str, who: PrincipalDep, services: ServicesDep) -> ModelPublic:
    who.require("deploy")
    with services.db.session() as s:
        return ModelPublic.of(catalog.delete_artifact(s, services.registry, ref))
