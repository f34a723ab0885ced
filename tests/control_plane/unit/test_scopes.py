"""Every operation that takes a body says which scope it needs, on a route that checks
it before the body is read (``api.scopes``)."""

from __future__ import annotations

from fastapi.routing import APIRoute

from control_plane.api.routes import (
    calls,
    canary,
    functions,
    health,
    invoke,
    keys,
    models,
    scaling,
    secrets,
    stats,
    uploads,
    workers,
)
from control_plane.api.scopes import SCOPE_EXTRA, ScopeFirstRoute
from control_plane.services.keys import SCOPES

MODULES = (
    calls,
    canary,
    functions,
    health,
    invoke,
    keys,
    models,
    scaling,
    secrets,
    stats,
    uploads,
    workers,
)


def test_every_route_with_a_body_checks_its_scope_first() -> None:
    with_body = [
        r
        for m in MODULES
        for r in m.router.routes
        if isinstance(r, APIRoute) and r.body_field is not None
    ]
    assert len(with_body) >= 10
    for route in with_body:
        assert isinstance(route, ScopeFirstRoute), route.path
        assert (route.openapi_extra or {}).get(SCOPE_EXTRA) in SCOPES, route.path
