"""What the router needs to know about a call beyond the replicas: the replica that
served its session last, and its prompt's prefix; and the hit rates of both.

The session memory is the calls table itself (``calls.session_id``): the
session's latest dispatched call names its replica, so every control-plane
process sees the same answer and nothing expires separately.
"""

from __future__ import annotations

import json

from sqlalchemy import select
from sqlalchemy.orm import Session

from control_plane.db.models import Call
from control_plane.metrics import Metrics
from control_plane.services.functions import ActiveVersion
from control_plane.services.router import CallRoute, Route, prefix_key


def session_replica(session: Session, function: str, session_id: str) -> str | None:
    """The replica of the session's latest dispatched call, or None."""
    return session.scalar(
        select(Call.replica_id)
        .where(
            Call.session_id == session_id,
            Call.function == function,
            Call.replica_id.is_not(None),
            Call.dispatched_at.is_not(None),
        )
        .order_by(Call.dispatched_at.desc())
        .limit(1)
    )


def call_route(session: Session, fn: ActiveVersion, call: Call, max_outstanding: int) -> CallRoute:
    """The router's view of ``call``: version, adapter, capacity, session and prefix."""
    last = session_replica(session, fn.name, call.session_id) if call.session_id else None
    key = None
    if fn.spec.routing is not None:
        routing = fn.spec.routing
        key = prefix_key(json.loads(call.input_json), routing.prompt_field, routing.prefix_chars)
    return CallRoute(
        version=fn.version,
        adapter=call.adapter,
        max_outstanding=max_outstanding,
        session_replica=last,
        prefix_key=key,
    )


def observe(
    metrics: Metrics | None, function: str, call: Call, route: CallRoute, chosen: Route
) -> None:
    """Count a session or prefix hit (the affinity's first replica took the call), miss
    (the router passed it over), or new (a session's first call)."""
    if metrics is None:
        return
    if call.session_id is not None:
        outcome = "hit" if chosen.policy == "session" else "miss"
        if route.session_replica is None:
            outcome = "new"  # the session's first call: nothing to stick to yet
        metrics.route_affinity.labels(function, "session", outcome).inc()
    elif route.prefix_key is not None:
        # A hit: the prefix's own replica; a spill to its next one counts as a miss.
        outcome = "hit" if chosen.policy == "prefix" and chosen.rank == 0 else "miss"
        metrics.route_affinity.labels(function, "prefix", outcome).inc()
