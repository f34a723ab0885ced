"""Liveness (no key) and Prometheus metrics (admin key)."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST

from control_plane.api.deps import PrincipalDep, ServicesDep
from control_plane.services.reconciler import refresh_gauges

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/metrics", response_class=Response)
def metrics(who: PrincipalDep, services: ServicesDep) -> Response:
    who.require("admin")
    with services.db.session() as s:
        refresh_gauges(s, services.metrics)
    return Response(services.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
