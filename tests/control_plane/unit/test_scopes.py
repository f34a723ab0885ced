"""Every operation that takes a body says which scope it needs, on a route that checks
it before the body is read (``api.scopes``)."""

from __future__ import annotations

import importlib
import pkgutil

from fastapi.routing import APIRoute

from control_plane.api import routes
from control_plane.api.scopes import SCOPE_EXTRA, ScopeFirstRoute
from control_plane.services.keys import SCOPES

# Every route module, found rather than listed: a new one is checked too.
MODULES = [
    importlib.import_module(f"{routes.__name__}.{m.name}")
    for m in pkgutil.iter_modules(routes.__path__)
]


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
