"""Replicas: created by the reconciler, moved along by the worker's events.

    pending ──▶ starting ──▶ ready ──▶ draining ──▶ stopped
       └───────────┴──────────▶ failed

``pending`` is the control plane's own state between deciding to start a
replica and the worker's first event. Events for a replica the control plane
already ended are ignored (the heartbeat reply tells the worker to stop it).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from sqlalchemy import bindparam, func, select, update
from sqlalchemy.orm import Session

from control_plane.db.models import Call, Replica, Worker
from control_plane.db.session import one_of
from control_plane.errors import NotFoundError
from control_plane.metrics import Metrics
from control_plane.protocol import AdapterSpec, ContainerOptions, ReplicaEvent, StartReplica
from control_plane.services import calls, coldstart
from control_plane.services.calls import requeue_or_fail
from control_plane.services.functions import ActiveVersion
from control_plane.services.router import ReplicaView
from control_plane.services.scheduler import Placement
from control_plane.services.states import (
    ENDED_REPLICA_STATES,
    IN_FLIGHT_CALL_STATES,
    LIVE_REPLICA_STATES,
)

# Which event states may follow which stored states.
_ALLOWED_FROM = {
    "starting": ("pending",),
    "ready": ("pending", "starting"),
    "draining": ("pending", "starting", "ready"),  # its worker is stopping (worker.agent)
    "failed": ("pending", "starting", "ready", "draining"),
    "stopped": ("pending", "starting", "ready", "draining"),
}


def create(
    session: Session,
    now: float,
    fn: ActiveVersion,
    placement: Placement,
    schedule_ms: float,
    requested_at: float | None = None,
) -> StartReplica:
    """Record a pending replica; return the message to send once committed.

    ``schedule_ms`` (the decision's own time) stands as the schedule phase
    until :func:`mark_dispatched` records when the start was sent; from then
    the phase runs from ``requested_at`` (default ``now``) to that send.
    """
    replica_id = uuid.uuid4().hex
    session.add(
        Replica(
            id=replica_id,
            function=fn.name,
            version=fn.version,
            worker_id=placement.worker_id,
            device=placement.device,
            state="pending",
            phases_json=json.dumps({"schedule": schedule_ms}),
            adapters_json=json.dumps([a.name for a in fn.adapters]),
            created_at=now,
            requested_at=now if requested_at is None else min(requested_at, now),
        )
    )
    session.flush()
    return StartReplica(
        replica_id=replica_id,
        function=fn.name,
        version=fn.version,
        bundle_digest=fn.spec.bundle,
        entry=fn.spec.entry,
        model_digest=fn.model_digest,
        adapters=[AdapterSpec(name=a.name, digest=a.digest) for a in fn.adapters],
        device="cuda" if placement.device == "cuda" else "cpu",
        timeout_s=fn.spec.timeout_s,
        env=dict(fn.spec.env),
        container=_container(fn),
        max_batch_size=fn.spec.batching.max_batch_size if fn.spec.batching else None,
        max_wait_ms=fn.spec.batching.max_wait_ms if fn.spec.batching else 0.0,
        max_concurrent_calls=fn.spec.scaling.target_concurrency,
        llm=fn.spec.llm,
    )


def mark_dispatched(session: Session, replica_id: str, now: float) -> None:
    """Record that the replica's ``StartReplica`` was sent (ends its schedule phase).

    A column of its own, so this never races the worker's events on ``phases_json``.
    """
    session.execute(
        update(Replica)
        .where(Replica.id == replica_id, Replica.dispatched_at.is_(None))
        .values(dispatched_at=now)
        .execution_options(synchronize_session=False)
    )


def _container(fn: ActiveVersion) -> ContainerOptions | None:
    spec = fn.spec
    if spec.runtime != "docker" or spec.image is None:
        return None
    return ContainerOptions(
        image=spec.image, network=spec.network, memory_bytes=spec.memory_bytes, cpus=spec.cpus
    )


def record_event(
    session: Session, metrics: Metrics | None, now: float, replica_id: str, ev: ReplicaEvent
) -> list[str]:
    """Apply a worker's replica event. Returns ids of calls it ended or re-queued."""
    row = session.get(Replica, replica_id)
    if row is None:
        raise NotFoundError(f"no replica {replica_id!r}")
    row.phases_json = json.dumps({**json.loads(row.phases_json), **ev.phases_ms})
    if row.state not in _ALLOWED_FROM[ev.state]:
        return []
    row.state = ev.state
    touched: list[str] = []
    if ev.state == "ready":
        row.ready_at = now
        coldstart.observe_start(metrics, row)
        if metrics is not None:
            metrics.cold_starts.labels(row.function).inc()
    elif ev.state in ENDED_REPLICA_STATES:
        row.stopped_at, row.error = now, ev.error
        reason = ev.error or "replica stopped"
        touched = _end_calls_of(session, metrics, now, row, reason, ev.fault or "replica")
    session.flush()
    return touched


def _end_calls_of(
    session: Session,
    metrics: Metrics | None,
    now: float,
    row: Replica,
    reason: str,
    fault: str,
) -> list[str]:
    """Retry or fail the calls ``row`` held. When the function's own start failed
    (``fault`` "function": its code, ``setup`` or artifacts) and no other replica of
    its version can serve, fail that version's queued calls too: such a failure
    repeats. Any other end leaves
    them queued for the next replica."""
    stranded = session.scalars(
        select(Call).where(Call.replica_id == row.id, Call.status.in_(IN_FLIGHT_CALL_STATES))
    ).all()
    touched = []
    for c in stranded:
        error = f"replica {row.id} ended: {reason}"
        requeue_or_fail(session, metrics, now, c, error, fault=fault)
        touched.append(c.id)
    start_failed = row.state == "failed" and row.ready_at is None and fault == "function"
    if start_failed and not _other_live(session, row):
        queued = session.scalars(
            select(Call.id).where(
                Call.function == row.function,
                Call.version == row.version,
                Call.status == "queued",
            )
        ).all()
        _paid_cold_start(session, row, list(queued))
        for call_id in queued:
            error = f"replica failed to start: {reason}"
            calls.finalize(
                session,
                metrics,
                now,
                call_id,
                "failed",
                error=error,
                from_states=("queued",),
                fault="function",
            )
            touched.append(call_id)
    return touched


def _paid_cold_start(session: Session, row: Replica, call_ids: list[str]) -> None:
    """Calls that waited for ``row``, which failed before it was ready: they paid a
    cold start, so they are cold, with its phases as far as it got."""
    if not call_ids:
        return
    session.execute(
        update(Call)
        .where(Call.id.in_(call_ids), Call.status == "queued")
        .values(cold=True, phases_json=json.dumps(coldstart.replica_phases(row)))
        .execution_options(synchronize_session=False)
    )


def _other_live(session: Session, row: Replica) -> bool:
    n = session.scalar(
        select(func.count(Replica.id)).where(
            Replica.function == row.function,
            Replica.version == row.version,
            Replica.id != row.id,
            Replica.state.in_(LIVE_REPLICA_STATES),
        )
    )
    return bool(n)


def live(session: Session, function: str) -> list[Replica]:
    return list(
        session.scalars(
            select(Replica)
            .where(Replica.function == function, Replica.state.in_(LIVE_REPLICA_STATES))
            .order_by(Replica.created_at)
        )
    )


def outstanding(session: Session, replica_ids: list[str]) -> dict[str, int]:
    rows = session.execute(
        select(Call.replica_id, func.count(Call.id))
        .where(Call.replica_id.in_(replica_ids), Call.status.in_(IN_FLIGHT_CALL_STATES))
        .group_by(Call.replica_id)
    ).all()
    return {str(rid): int(n) for rid, n in rows}


# ``views``' one read, built once (a statement used again is not built and keyed anew).
_IN_FLIGHT = (
    select(func.count(Call.id))
    .where(Call.replica_id == Replica.id, one_of(Call.status, IN_FLIGHT_CALL_STATES))
    .correlate(Replica)
    .scalar_subquery()
)
_VIEWS = (
    select(
        Replica.id,
        Replica.state,
        Replica.version,
        Replica.adapters_json,
        _IN_FLIGHT,
        Replica.worker_id,
        Replica.ready_at,
        Worker.data_addr,
        Worker.data_token,
    )
    .outerjoin(Worker, Worker.id == Replica.worker_id)
    .where(Replica.function == bindparam("function"), one_of(Replica.state, LIVE_REPLICA_STATES))
    .order_by(Replica.created_at)
)


@dataclass(frozen=True)
class ReplicaHome:
    """Where a live replica runs, as routing read it: its worker, that worker's
    direct call port (``worker.dataplane``; None: it has none), and since when the
    replica is ready (a call accepted before that waited for it: a cold call)."""

    worker_id: str
    ready_at: float | None
    data_addr: str | None
    data_token: str | None


def views(session: Session, function: str, places: dict[str, ReplicaHome]) -> list[ReplicaView]:
    """The function's live replicas as the router sees them, in one read of a few
    columns (no row objects): each with its outstanding calls, and in ``places``
    where it runs."""
    rows = session.connection().execute(_VIEWS, {"function": function}).all()
    out = []
    for rid, state, version, adapters_json, n, worker_id, ready_at, addr, token in rows:
        adapters = frozenset(json.loads(adapters_json))
        out.append(ReplicaView(rid, state, version, int(n or 0), adapters))
        places[rid] = ReplicaHome(worker_id, ready_at, addr, token)
    return out


def counts_by_state(session: Session) -> dict[tuple[str, str], int]:
    rows = session.execute(
        select(Replica.function, Replica.state, func.count(Replica.id))
        .where(Replica.state.in_((*LIVE_REPLICA_STATES, "draining")))
        .group_by(Replica.function, Replica.state)
    ).all()
    return {(str(f), str(s)): int(n) for f, s, n in rows}


def function_of(session: Session, replica_id: str) -> str:
    row = session.get(Replica, replica_id)
    if row is None:
        raise NotFoundError(f"no replica {replica_id!r}")
    return row.function
