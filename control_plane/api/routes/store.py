"""Where the control plane's store is, for any valid key (never its credentials).

GET /v1/store   → StorePublic (``thaw models push`` and co. use it by default)
"""

from __future__ import annotations

from fastapi import APIRouter

from control_plane.api.deps import PrincipalDep, ServicesDep
from control_plane.api.schemas_store import StorePublic
from control_plane.services import store_location

router = APIRouter(tags=["store"])


@router.get("/v1/store")
def show_store(who: PrincipalDep, services: ServicesDep) -> StorePublic:
    del who  # any valid key: a pushing CLI may hold only a deploy or worker key
    return StorePublic.of(store_location.of(services.registry, services.settings))
