"""Moving one queued call onto a ready replica: the step the reconciler repeats
for its queue, and the direct path takes for a new synchronous call.

``route_one`` asks the router (session, prefix, adapter, then least
outstanding), moves the call queued → dispatched by a guarded UPDATE (so no
call is dispatched twice, whoever else routes it at the same moment), and
returns the replica and the message that runs it; or ``NO_ROOM`` (no ready
replica has room: later calls will not find one either) or ``TAKEN`` (the
call was no longer queued). Nothing is sent here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import inspect, update
from sqlalchemy.orm import Session

from control_plane.db.models import Call, Replica
from control_plane.metrics import Metrics
from control_plane.protocol import RunCall
from control_plane.services import affinity, calls, coldstart, router
from control_plane.services.functions import ActiveVersion
from control_plane.services.replicas import ReplicaHome
from control_plane.services.router import ReplicaView
from control_plane.tracing import call_traceparent

NO_ROOM: Literal["no_room"] = "no_room"
TAKEN: Literal["taken"] = "taken"


@dataclass(frozen=True)
class Dispatched:
    place: ReplicaHome  # where the replica runs
    view: ReplicaView  # the replica as chosen, before this call
    message: RunCall


def route_one(
    session: Session,
    metrics: Metrics | None,
    fn: ActiveVersion,
    call: Call,
    views: list[ReplicaView],
    places: Mapping[str, ReplicaHome],
    now: float,
) -> Dispatched | Literal["no_room", "taken"]:
    """Dispatch ``call`` to one of ``views``, which run at ``places`` (as
    ``replicas.views`` read them; see the module docstring)."""
    limit = fn.spec.replica_capacity  # a batched replica takes a whole batch
    route = affinity.call_route(session, fn, call, limit)
    decision = router.route(views, route)
    if decision is None:
        return NO_ROOM
    replica_id = decision.replica.id
    place = places[replica_id]
    if not mark_dispatched(session, call, replica_id, place.ready_at, fn, now):
        return TAKEN
    affinity.observe(metrics, fn.name, call, route, decision)
    return Dispatched(place, decision.replica, run_message(call, replica_id, fn))


def mark_dispatched(
    session: Session,
    call: Call,
    replica_id: str,
    ready_at: float | None,
    fn: ActiveVersion,
    now: float,
) -> bool:
    """queued → dispatched on the replica (ready since ``ready_at``); False when the
    call was no longer queued. A call not yet written (``calls.accepting``) is
    changed before it is written. A call that waited for its replica to start (a
    cold one) takes the replica's phases, read here. A call that paid a cold start on
    an earlier attempt stays cold, with that start's phases."""
    waited = ready_at is not None and ready_at >= call.accepted_at
    replica = session.get(Replica, replica_id) if waited else None
    if replica is not None:
        phases = coldstart.replica_phases(replica)
    else:
        phases = json.loads(call.phases_json) if call.cold else {}
    cold = waited or bool(call.cold)
    timings = {**json.loads(call.timings_json), "queue_wait": (now - call.accepted_at) * 1000}
    values = {
        "status": "dispatched",
        "replica_id": replica_id,
        "version": fn.version,
        "dispatched_at": now,
        "cold": cold,
        "phases_json": json.dumps(phases),
        "timings_json": json.dumps(timings),
    }
    if not inspect(call).has_identity:  # not written yet: nobody else can see it
        for name, value in values.items():
            setattr(call, name, value)
        return True
    result = session.execute(
        update(Call)
        .where(Call.id == call.id, Call.status == "queued")
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
        session.expire(call)  # someone else moved it: read it again if used
        return False
    calls.note_written(call, values)  # the session's copy, as written (no re-read)
    return True


def run_message(call: Call, replica_id: str, fn: ActiveVersion) -> RunCall:
    return RunCall(
        call_id=call.id,
        attempt=call.attempt,
        replica_id=replica_id,
        function=fn.name,
        input=json.loads(call.input_json),
        adapter=call.adapter,
        stream=call.stream,
        timeout_s=max(0.001, call.deadline_at - call.accepted_at),
        accepted_at=call.accepted_at,
        traceparent=call_traceparent(call.id),
    )


def requeue(session: Session, call_id: str) -> None:
    """dispatched → queued again: its message could not be sent."""
    session.execute(
        update(Call)
        .where(Call.id == call_id, Call.status == "dispatched")
        .values(status="queued", replica_id=None)
    )
