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

The state is derived from the worker's newest finished calls in the database
and kept nowhere else, so every control-plane process reaches the same
verdict. ``breaker_state`` is the pure decision; ``states`` reads its inputs.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from control_plane.db.models import Call, Replica, Worker
from control_plane.services.scheduler import WorkerSnapshot
from control_plane.services.states import IN_FLIGHT_CALL_STATES

BreakerState = Literal["closed", "open", "half_open"]
# Outcomes that say something about the worker (cancelled and expired do not).
_JUDGED = ("succeeded", "failed", "timeout")


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
    for worker_id in session.scalars(select(Worker.id).where(Worker.lost.is_(False))):
        on_worker = select(Replica.id).where(Replica.worker_id == worker_id)
        rows = session.execute(
            select(Call.status, Call.finished_at)
            .where(Call.replica_id.in_(on_worker), Call.status.in_(_JUDGED))
            .order_by(Call.finished_at.desc())
            .limit(threshold)
        ).all()
        newest = [Outcome(s != "succeeded", float(t or 0.0)) for s, t in rows]
        in_flight = session.scalar(
            select(func.count(Call.id)).where(
                Call.replica_id.in_(on_worker), Call.status.in_(IN_FLIGHT_CALL_STATES)
            )
        )
        state = breaker_state(newest, threshold, probe_interval_s, now, int(in_flight or 0))
        if state != "closed":
            out[worker_id] = state
    return out


def without_open(
    snapshots: list[WorkerSnapshot], breakers: dict[str, BreakerState]
) -> list[WorkerSnapshot]:
    """The scheduler's view with every worker whose breaker is not closed unhealthy
    (no new replicas there until a probe passes)."""
    return [replace(w, healthy=False) if w.id in breakers else w for w in snapshots]


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
