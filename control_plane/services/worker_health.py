"""Workers that heartbeat but fail every call: a circuit breaker per worker.

    closed ──(threshold newest calls all failed)──▶ open ──(probe_interval_s)──▶ half-open
      ▲                                               ▲                            │
      └──────────────── the probe call succeeds ──────┴──── the probe call fails ──┘

Open: the worker gets no new calls and no new replicas. Half-open: one call,
the probe, may go to it while nothing else is in flight there; the probe's
outcome closes the breaker (it succeeded) or opens it again for another
``probe_interval_s`` (it failed). The probe is a real call, not a synthetic
one, so it proves what matters (this worker can run this function's calls);
at most one call per interval is risked on a broken worker.

Only outcomes that say something about the worker are judged: a call that
succeeded, and a call that failed because its replica died or stopped
answering (``Call.fault`` "replica"). A function's own exceptions, its
timeouts and its failed ``setup`` are the caller's or the function's and are
not counted, so no caller can open a worker's breaker with bad input.

A breaker has a way back that does not need what it blocks: a half-open
worker with no replica of a function may still be given one when no closed
worker can take it (``without_open``), and that replica's first call is the
probe. Without it, a function scaled to zero on its only worker would stay
locked out.

The state is derived from the worker's newest finished calls in the database
and kept nowhere else, so every control-plane process reaches the same
verdict. ``breaker_state`` is the pure decision; ``states`` reads its inputs.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from sqlalchemy import ColumnElement, and_, bindparam, func, or_, select
from sqlalchemy.orm import Session

from control_plane.db.models import Call, Replica, Worker
from control_plane.db.session import one_of
from control_plane.services.scheduler import WorkerSnapshot
from control_plane.services.states import IN_FLIGHT_CALL_STATES

BreakerState = Literal["closed", "open", "half_open"]


@dataclass(frozen=True)
class Outcome:
    failed: bool
    finished_at: float


def breaker_state(
    newest_first: Sequence[Outcome],
    threshold: int,
    probe_interval_s: float,
    now: float,
    in_flight: int,
) -> BreakerState:
    """The worker's breaker from its newest judged calls (newest first).

    ``threshold`` 0 turns the breaker off.
    """
    if threshold <= 0 or len(newest_first) < threshold:
        return "closed"
    if not all(o.failed for o in newest_first[:threshold]):
        return "closed"
    if now - newest_first[0].finished_at >= probe_interval_s and in_flight == 0:
        return "half_open"
    return "open"


def states(
    session: Session, now: float, threshold: int, probe_interval_s: float
) -> dict[str, BreakerState]:
    """Each live worker's breaker state, by worker id (closed ones left out)."""
    out: dict[str, BreakerState] = {}
    if threshold <= 0:
        return out
    session.flush()  # the reads below run on the connection, past the session
    conn = session.connection()
    for (worker_id,) in conn.execute(_LIVE_WORKERS).all():
        params = {"worker": worker_id, "threshold": threshold}
        rows = conn.execute(_NEWEST_JUDGED, params).all()
        newest = [Outcome(s != "succeeded", float(t or 0.0)) for s, t in rows]
        in_flight = conn.execute(_IN_FLIGHT_ON_WORKER, params).scalar()
        state = breaker_state(newest, threshold, probe_interval_s, now, int(in_flight or 0))
        if state != "closed":
            out[worker_id] = state
    return out


def _judged() -> ColumnElement[bool]:
    """Outcomes that say something about the worker (see the module docstring)."""
    return or_(Call.status == "succeeded", and_(Call.status == "failed", Call.fault == "replica"))


# ``states``' reads, built once (every reconcile tick runs them for every worker).
_LIVE_WORKERS = select(Worker.id).where(Worker.lost.is_(False))
_ON_WORKER = select(Replica.id).where(Replica.worker_id == bindparam("worker")).scalar_subquery()
_NEWEST_JUDGED = (
    select(Call.status, Call.finished_at)
    .where(Call.replica_id.in_(_ON_WORKER), _judged())
    .order_by(Call.finished_at.desc())
    .limit(bindparam("threshold"))
)
_IN_FLIGHT_ON_WORKER = select(func.count(Call.id)).where(
    Call.replica_id.in_(_ON_WORKER), one_of(Call.status, IN_FLIGHT_CALL_STATES)
)


def without_open(
    snapshots: list[WorkerSnapshot],
    breakers: dict[str, BreakerState],
    probing: bool = False,
) -> list[WorkerSnapshot]:
    """The scheduler's view with every worker whose breaker is not closed unhealthy
    (no new replicas there until a probe passes); with ``probing``, half-open ones
    stay eligible (the caller found no closed worker, and a replica there is the
    probe)."""
    blocked = {w for w, s in breakers.items() if s == "open" or not probing}
    return [replace(w, healthy=False) if w.id in blocked else w for w in snapshots]


class BreakerCache:
    """``states`` computed at most once per ``max_age_s`` in this process: the fast
    path of warm calls (``services.direct_calls``) asks on every call, and a
    breaker that opens a second late costs at most a second of calls."""

    def __init__(self, max_age_s: float = 1.0) -> None:
        self.max_age_s = max_age_s
        self._lock = threading.Lock()
        self._at: float | None = None
        self._value: dict[str, BreakerState] = {}

    def get(
        self, session: Session, now: float, threshold: int, probe_interval_s: float
    ) -> dict[str, BreakerState]:
        with self._lock:
            if self._at is not None and 0 <= now - self._at < self.max_age_s:
                return self._value
        value = states(session, now, threshold, probe_interval_s)
        with self._lock:
            self._at, self._value = now, value
        return value
