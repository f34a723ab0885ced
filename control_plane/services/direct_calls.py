"""The fast path of a synchronous call: routed as it is accepted, run over the
worker's direct port, its result recorded by the thread that waits for it.

    accept + route_one (one transaction) ──▶ DirectChannel.run ──▶ record the final event
          │ no ready replica with room            │ not sent            │ lost / deadline
          ▼                                       ▼                     ▼
    queue + reconciler (the usual path)     back in the queue     wait on the database

Compared with the queued path this skips the broker hop, the worker's HTTP
event posts and a reconcile pass per event. The guarantees stay the same:
the call is dispatched by the same guarded UPDATE, the worker dedupes by
(call id, attempt), and whatever cannot come back on the connection comes
back over HTTP (``worker.dataplane``) or through lost-worker handling.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy.orm import Session

from control_plane.db.models import Call
from control_plane.metrics import Metrics
from control_plane.protocol import RunCall
from control_plane.services import replicas
from control_plane.services.dispatching import Dispatched, route_one
from control_plane.services.functions import ActiveVersion
from control_plane.services.router import ReplicaView
from control_plane.services.worker_health import BreakerState


@dataclass(frozen=True)
class Claim:
    """A call dispatched by the fast path and not yet sent."""

    call_id: str
    function: str
    worker_id: str
    message: RunCall
    deadline_at: float
    data_addr: str | None  # None: the worker has no direct port; send through its queue
    data_token: str | None
    # The call's row as dispatched (detached): recording each event attaches it to
    # that event's session instead of reading it again, so it follows what was
    # recorded. Whatever changed since in the database, the guarded updates see.
    row: Call


def claim(
    session: Session,
    metrics: Metrics | None,
    fn: ActiveVersion,
    call: Call,
    now: float,
    breakers: Mapping[str, BreakerState] | None = None,
) -> Claim | None:
    """Dispatch a just-accepted call to a ready replica with room, or None (it stays
    queued). ``breakers`` (``services.worker_health``, closed ones left out): replicas
    on an open worker are passed over; while a worker of the function is half-open,
    no call takes the fast path, so the queue sends that worker its probe.
    """
    if call.status != "queued":
        return None
    live, places = _live_replicas(session, fn.name)
    views = [v for v in live if v.state == "ready"]
    if breakers:
        state = {v.id: breakers.get(places[v.id].worker_id, "closed") for v in views}
        if "half_open" in state.values():
            return None
        views = [v for v in views if state[v.id] == "closed"]
    if not views:
        return None
    done = route_one(session, metrics, fn, call, views, places, now)
    if not isinstance(done, Dispatched):
        return None
    taken = live.index(done.view)  # one more call in flight on it, for the next claim
    live[taken] = replace(done.view, outstanding=done.view.outstanding + 1)
    return claim_of(fn.name, call, done)


def _live_replicas(
    session: Session, function: str
) -> tuple[list[ReplicaView], dict[str, replicas.ReplicaHome]]:
    """``function``'s live replicas and where they run, read once a transaction: the
    calls of a burst accepted together (``Invocations._accept_batch``) are routed in
    turn on one read, each counting the calls the ones before it dispatched."""
    read: dict[str, Any] = session.info.setdefault("live_replicas", {})
    found = read.get(function)
    if found is None:
        places: dict[str, replicas.ReplicaHome] = {}
        found = read[function] = (replicas.views(session, function, places), places)
    return found


def claim_of(function: str, call: Call, done: Dispatched) -> Claim:
    """The claim for ``call`` as ``route_one`` dispatched it: what sending it needs."""
    place = done.place
    return Claim(
        call.id,
        function,
        place.worker_id,
        done.message,
        call.deadline_at,
        place.data_addr if place.data_token else None,
        place.data_token,
        call,
    )
