"""Scope before body: a key that may not use an operation hears 403, whatever it sent.

FastAPI reads an operation's JSON body and validates it before the endpoint
runs, and the endpoint (or its service) is where the key's scope is checked
(``Principal.require``). A key without the scope that sent a bad body heard
422, and learned the body's schema of an operation it may not use.

An operation that takes a body declares what it needs
(``openapi_extra=needs("invoke", function_param="name")``, shown in the OpenAPI
document as ``x-thaw-scope``) and its router uses ``ScopeFirstRoute``: the key
is verified and its scope checked before FastAPI reads the body. The check in
the route or service stays, the reference for every path (``api.fast_invoke``
included); this one answers earlier, with the same error.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from control_plane.api.deps import principal_of

SCOPE_EXTRA = "x-thaw-scope"
FUNCTION_PARAM_EXTRA = "x-thaw-function-param"

Handler = Callable[[Request], Coroutine[Any, Any, Response]]


def needs(scope: str, function_param: str | None = None) -> dict[str, Any]:
    """``openapi_extra`` of an operation that needs ``scope`` (on the function named by
    its path parameter ``function_param``, when a key may be limited to one)."""
    extra: dict[str, Any] = {SCOPE_EXTRA: scope}
    if function_param is not None:
        extra[FUNCTION_PARAM_EXTRA] = function_param
    return extra


class ScopeFirstRoute(APIRoute):
    """A route that checks the scope its operation ``needs`` before reading the body."""

    def get_route_handler(self) -> Handler:
        handler = super().get_route_handler()
        extra = self.openapi_extra or {}
        scope: str | None = extra.get(SCOPE_EXTRA)
        if scope is None:
            return handler
        function_param: str | None = extra.get(FUNCTION_PARAM_EXTRA)

        async def scope_first(request: Request) -> Response:
            who = await principal_of(request)
            function = request.path_params.get(function_param) if function_param else None
            who.require(scope, function)
            return await handler(request)

        return scope_first
