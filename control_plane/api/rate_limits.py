"""The invoke routes' rate-limit check (a router dependency, run before the handler).

Order: the key is authenticated (401), its scope checked on the function
(403), then its bucket and the function's are charged (429 with
``Retry-After``). All three happen before a call is recorded or anything is
scheduled, so no refused request can start a replica.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import Request
from fastapi.concurrency import run_in_threadpool

from control_plane.api.deps import PrincipalDep
from control_plane.errors import NotFoundError
from control_plane.services import functions
from control_plane.services.context import Services
from control_plane.services.keys import Principal
from control_plane.services.ratelimit import Limit, RateLimiter
from control_plane.services.ratelimit_zone import ZONE_FILE, SharedBuckets


def function_limit_reader(services: Services) -> Callable[[str], Limit | None]:
    """Reads a function's ``[limits]`` from its active version (None: no limit or no
    such function; the handler reports the latter)."""

    def read(name: str) -> Limit | None:
        with services.db.session() as s:
            try:
                spec = functions.active(s, name).spec
            except NotFoundError:  # the handler says so, with what to do
                return None
        return Limit.of(spec.limits.calls_per_s, spec.limits.burst) if spec.limits else None

    return read


def make_rate_limiter(services: Services) -> RateLimiter:
    """The processes of one ``thaw server --processes N`` share their buckets (in
    their peer directory); a single process keeps its own."""
    peer_dir = services.settings.peer_dir
    buckets = SharedBuckets(peer_dir / ZONE_FILE) if peer_dir is not None else None
    return RateLimiter(services.clock, function_limit_reader(services), buckets)


def charge_if_known(limiter: RateLimiter, who: Principal, name: str) -> bool:
    """403 or 429 as errors, else charge the buckets; False (nothing charged) when the
    function's limit has to be read first (``limiter.check`` off the event loop)."""
    who.require("invoke", name)
    if not limiter.knows(name):
        return False
    limiter.check(who.key_id, who.rate, name)
    return True


async def enforce_rate_limit(name: str, who: PrincipalDep, request: Request) -> None:
    """401/403/429 for ``POST /v1/functions/{name}/invoke`` before the call exists.
    On the event loop, unless the function's limit has to be read first."""
    limiter: RateLimiter = request.app.state.rate_limiter
    if not charge_if_known(limiter, who, name):
        await run_in_threadpool(limiter.check, who.key_id, who.rate, name)
