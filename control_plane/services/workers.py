"""Workers: registration, heartbeats, and noticing the ones that went silent.

A worker that has not heartbeated for ``worker_lost_after_s`` is lost: its
replicas are stopped, and its in-flight calls are re-queued (attempt + 1)
while retries remain, else failed. Replacement replicas come from the
autoscaler on the next reconcile.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from control_plane.db.models import Call, Replica, Worker
from control_plane.errors import ConflictError, NotFoundError
from control_plane.fingerprints import Fingerprint, differences
from control_plane.metrics import Metrics, set_series
from control_plane.protocol import HeartbeatReply, WorkerHeartbeat, WorkerRegister, worker_queue
from control_plane.services import calls, inventory
from control_plane.services.scheduler import WorkerSnapshot
from control_plane.services.states import IN_FLIGHT_CALL_STATES, LIVE_REPLICA_STATES

log = logging.getLogger(__name__)

MAX_REPLICAS_PER_WORKER = 16
_STOPPABLE = (*LIVE_REPLICA_STATES, "draining")
_IN_FLIGHT = IN_FLIGHT_CALL_STATES


@dataclass(frozen=True)
class LostWork:
    worker_ids: list[str]
    touched_call_ids: list[str]


def register(
    session: Session,
    metrics: Metrics | None,
    now: float,
    msg: WorkerRegister,
    server: Fingerprint | None = None,
) -> tuple[Worker, list[str]]:
    """Create or refresh the worker's record (a restarted worker re-registers).

    Returns the row and the ids of calls it re-queued or failed: a worker
    that restarted lost its replicas and the calls running on them. Raises
    ``ConflictError`` (nothing recorded) for a worker whose broker or store is
    not ``server``'s, or whose name another live worker has.
    """
    check_admission(session, msg, server)
    touched: list[str] = []
    row = session.get(Worker, msg.worker_id)
    if row is None:
        row = Worker(id=msg.worker_id, registered_at=now, queue=worker_queue(msg.worker_id))
        session.add(row)
    else:
        touched = _abandon(session, metrics, now, row.id, "its worker restarted")
    row.name = msg.name
    row.devices_json = json.dumps([d.model_dump() for d in msg.devices])
    row.memory_bytes = msg.memory_bytes
    row.free_memory_bytes = msg.memory_bytes
    row.pool_size = msg.pool_size
    row.cached_manifests_json = json.dumps(msg.cached_manifests)
    row.cache_bytes = msg.cache_bytes
    row.data_addr, row.data_token = msg.data_addr, msg.data_token
    row.healthy, row.lost, row.last_heartbeat_at = True, False, now
    session.flush()
    return row, touched


def check_admission(session: Session, msg: WorkerRegister, server: Fingerprint | None) -> None:
    """Refuse a worker that could never serve here, or that two workers' names would blur."""
    if server is not None and msg.broker is not None and msg.store is not None:
        diffs = differences(server, Fingerprint(msg.broker, msg.store))
        if diffs:
            raise ConflictError(
                f"worker {msg.name or msg.worker_id} refused: " + "; and ".join(diffs)
            )
    if not msg.name:
        return
    other = session.scalar(
        select(Worker.id).where(
            Worker.name == msg.name, Worker.id != msg.worker_id, Worker.lost.is_(False)
        )
    )
    if other is not None:
        raise ConflictError(
            f"worker name {msg.name!r} is taken by live worker {other}; set another "
            "THAW_WORKER_NAME (or leave it unset for a unique default)"
        )


def heartbeat(session: Session, now: float, worker_id: str, msg: WorkerHeartbeat) -> HeartbeatReply:
    """Record the worker's inventory; reply with calls to cancel and replicas to stop."""
    row = session.get(Worker, worker_id)
    if row is None:
        raise NotFoundError(f"worker {worker_id} is not registered; it must register first")
    row.cached_manifests_json = json.dumps(msg.cached_manifests)
    row.cache_bytes, row.free_memory_bytes = msg.cache_bytes, msg.free_memory_bytes
    if row.healthy and not msg.healthy:
        log.warning("worker %s is unhealthy: %s", worker_id, msg.unhealthy_reason or "(no reason)")
    row.pool_size, row.healthy, row.last_heartbeat_at = msg.pool_size, msg.healthy, now
    row.inventory_json = inventory.encode(msg)
    row.lost = False
    known = {
        r.id: r.state
        for r in session.scalars(select(Replica).where(Replica.worker_id == worker_id))
    }
    stop = [
        r.replica_id
        for r in msg.replicas
        if r.state in ("starting", "ready") and known.get(r.replica_id) not in LIVE_REPLICA_STATES
    ]
    cancel = list(
        session.scalars(
            select(Call.id)
            .join(Replica, Replica.id == Call.replica_id)
            .where(Replica.worker_id == worker_id, Call.cancel_pending.is_(True))
        )
    )
    if cancel:
        session.execute(update(Call).where(Call.id.in_(cancel)).values(cancel_pending=False))
    session.flush()
    return HeartbeatReply(cancel_call_ids=cancel, stop_replica_ids=stop)


def _stop_replicas_of(session: Session, worker_id: str, now: float, reason: str) -> None:
    session.execute(
        update(Replica)
        .where(Replica.worker_id == worker_id, Replica.state.in_(_STOPPABLE))
        .values(state="stopped", stopped_at=now, error=reason)
        .execution_options(synchronize_session=False)
    )


def mark_lost(
    session: Session, metrics: Metrics | None, now: float, lost_after_s: float
) -> LostWork:
    """Mark silent workers lost; stop their replicas; retry or fail their calls."""
    silent = list(
        session.scalars(
            select(Worker).where(
                Worker.lost.is_(False), Worker.last_heartbeat_at < now - lost_after_s
            )
        )
    )
    touched: list[str] = []
    for w in silent:
        w.lost = True
        reason = f"worker {w.name or w.id} stopped heartbeating"
        touched += _abandon(session, metrics, now, w.id, reason)
    session.flush()
    return LostWork([w.id for w in silent], touched)


def _abandon(
    session: Session, metrics: Metrics | None, now: float, worker_id: str, reason: str
) -> list[str]:
    """Stop a worker's replicas in the books; retry or fail the calls they were running."""
    replica_ids = select(Replica.id).where(Replica.worker_id == worker_id)
    stranded = session.scalars(
        select(Call).where(Call.replica_id.in_(replica_ids), Call.status.in_(_IN_FLIGHT))
    ).all()
    for c in stranded:
        calls.requeue_or_fail(session, metrics, now, c, reason)
    _stop_replicas_of(session, worker_id, now, reason)
    return [c.id for c in stranded]


def refresh_pool_gauges(session: Session, m: Metrics) -> None:
    """Set each live worker's pool gauges from its latest heartbeat.

    Values are overwritten in place and only the labels of workers that are
    gone are removed, so a concurrent scrape never sees a live worker missing.
    """
    size: dict[tuple[str, ...], float] = {}
    idle: dict[tuple[str, ...], float] = {}
    busy: dict[tuple[str, ...], float] = {}
    gpus: dict[tuple[str, ...], float] = {}
    for w in session.scalars(select(Worker).where(Worker.lost.is_(False))):
        size[(w.id,)] = w.pool_size
        inv = inventory.decode(w.inventory_json)
        if inv.pool_idle is not None:
            idle[(w.id,)] = inv.pool_idle
        if inv.pool_busy is not None:
            busy[(w.id,)] = inv.pool_busy
        for device, pct in enumerate(inv.gpu_utilization_pct or ()):
            gpus[(w.id, str(device))] = pct / 100
    set_series(m.worker_pool_size, size)
    set_series(m.worker_pool_idle, idle)
    set_series(m.worker_pool_busy, busy)
    set_series(m.worker_gpu_utilization, gpus)


def snapshots(session: Session) -> list[WorkerSnapshot]:
    """The scheduler's view of every worker that is not lost."""
    out = []
    for w in session.scalars(select(Worker).where(Worker.lost.is_(False)).order_by(Worker.id)):
        live_q = select(Replica.id).where(
            Replica.worker_id == w.id, Replica.state.in_(LIVE_REPLICA_STATES)
        )
        states = session.scalars(
            select(Replica.state).where(
                Replica.worker_id == w.id, Replica.state.in_(LIVE_REPLICA_STATES)
            )
        ).all()
        outstanding = session.scalar(
            select(func.count(Call.id)).where(
                Call.replica_id.in_(live_q), Call.status.in_(_IN_FLIGHT)
            )
        )
        kinds = frozenset(d.get("kind", "cpu") for d in json.loads(w.devices_json)) | {"cpu"}
        inv = inventory.decode(w.inventory_json)
        out.append(
            WorkerSnapshot(
                id=w.id,
                healthy=w.healthy,
                device_kinds=kinds,
                free_memory_bytes=w.free_memory_bytes,
                replicas=len(states),
                max_replicas=MAX_REPLICAS_PER_WORKER,
                outstanding_calls=int(outstanding or 0),
                cached_manifests=frozenset(json.loads(w.cached_manifests_json)),
                starting_replicas=sum(s in ("pending", "starting") for s in states),
                holdings=inv.holdings,
                bandwidths=inv.bandwidths,
            )
        )
    return out
