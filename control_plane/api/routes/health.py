"""Liveness (no key) and Prometheus metrics (admin key)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.openapi.utils import get_openapi
from prometheus_client import CONTENT_TYPE_LATEST

from control_plane.api.deps import PrincipalDep, ServicesDep
from control_plane.metrics import merged
from control_plane.peers import peer_expositions
from control_plane.services.function_gauges import refresh_function_gauges
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
        refresh_function_gauges(s, services.metrics)
    text = services.metrics.exposition()
    if services.peers is not None:  # this server's other processes count too
        text = merged(text, peer_expositions(services.peers))
    return Response(text, media_type=CONTENT_TYPE_LATEST)


@router.get("/openapi.json", include_in_schema=False)
def openapi(request: Request, who: PrincipalDep) -> dict[str, Any]:
    """The OpenAPI document, for any valid key (schemathesis, client generators)."""
    app = request.app
    if app.openapi_schema is None:
        app.openapi_schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
    schema: dict[str, Any] = app.openapi_schema
    return schema
