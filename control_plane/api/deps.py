"""Typed dependencies: the app's services and the calling key (``PrincipalDep``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from control_plane.services import keys
from control_plane.services.context import Services
from control_plane.services.invocations import Invocations
from control_plane.services.keys import Principal

bearer = HTTPBearer(auto_error=False, description="an API key: thaw_<id>_<secret>")


# ``async``: FastAPI runs a plain ``def`` dependency on its thread pool, a hop per
# dependency per request; these only read the app's state.
async def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


async def get_invocations(request: Request) -> Invocations:
    inv: Invocations = request.app.state.invocations
    return inv


ServicesDep = Annotated[Services, Depends(get_services)]
InvocationsDep = Annotated[Invocations, Depends(get_invocations)]


async def get_principal(
    request: Request,
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Principal:
    """The key in ``Authorization: Bearer``; 401 when missing, malformed or revoked."""
    known: Principal | None = getattr(request.state, "principal", None)
    if known is not None:  # verified earlier in this request (``api.scopes``)
        return known
    services: Services = request.app.state.services
    who = await verify_token(services, creds.credentials if creds is not None else None)
    request.state.principal = who
    return who


async def principal_of(request: Request) -> Principal:
    """``get_principal`` outside FastAPI's dependency solving (before the body is read)."""
    return await get_principal(request, await bearer(request))


async def verify_token(services: Services, token: str | None) -> Principal:
    """The principal ``token`` names. A key verified a moment ago is not read again
    (``keys.PrincipalCache``)."""
    cache = services.principals
    who = cache.get(token) if cache is not None else None
    if who is None:
        who = await run_in_threadpool(_authenticate, services, token)
        if cache is not None and token is not None:
            cache.put(token, who)
    return who


def _authenticate(services: Services, token: str | None) -> Principal:
    with services.db.session() as session:
        return keys.authenticate(session, token)


PrincipalDep = Annotated[Principal, Depends(get_principal)]
