"""What the console shows about functions: status, replicas by state, call latency.

Latency of a call is ``finished_at - accepted_at`` (what the caller waited,
queueing and any cold start included), in milliseconds, over the function's
most recent finished calls (at most ``window`` of them), split into cold and
warm: p50/p90/p95/p99. Percentiles use the nearest-rank method, so every
reported value is a latency some call really had. Phase medians are over
the succeeded cold calls in the window (each carries its replica's phases).
The cold-start rate is cold calls over calls that reached a replica.

A function's status is derived, not stored::

    serving       at least one ready replica of the active version
    starting      replicas pending or starting, none ready
    scaled-to-zero no live replica
    no-version    the function has no active version
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from control_plane.db.models import Call, Function, Replica
from control_plane.errors import NotFoundError
from control_plane.protocol import REPLICA_PHASES
from control_plane.services.calls import CallView, view
from control_plane.services.states import FINAL_CALL_STATES

DEFAULT_WINDOW = 1000
MAX_RECENT_CALLS = 500


@dataclass(frozen=True)
class LatencySummary:
    count: int
    p50_ms: float | None
    p95_ms: float | None
    p90_ms: float | None = None
    p99_ms: float | None = None


@dataclass(frozen=True)
class FunctionStats:
    name: str
    version: int | None
    status: str
    replicas: dict[str, int]
    calls: int
    calls_failed: int
    cold_start_rate: float | None
    warm: LatencySummary
    cold: LatencySummary
    phase_medians_ms: dict[str, float] = field(default_factory=dict)


def percentile(values_ms: list[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in [0, 100]); ``None`` for no values."""
    if not values_ms:
        return None
    ordered = sorted(values_ms)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def summarize(values_ms: list[float]) -> LatencySummary:
    return LatencySummary(
        count=len(values_ms),
        p50_ms=percentile(values_ms, 50),
        p95_ms=percentile(values_ms, 95),
        p90_ms=percentile(values_ms, 90),
        p99_ms=percentile(values_ms, 99),
    )


def phase_medians(phases: list[dict[str, float]]) -> dict[str, float]:
    """Per phase, the nearest-rank median over the cold starts that recorded it,
    in the order the phases happen (unknown names last, sorted)."""
    values: dict[str, list[float]] = {}
    for p in phases:
        for name, ms in p.items():
            values.setdefault(name, []).append(float(ms))
    order = {name: i for i, name in enumerate(REPLICA_PHASES)}
    names = sorted(values, key=lambda n: (order.get(n, len(order)), n))
    return {n: m for n in names if (m := percentile(values[n], 50)) is not None}


def status_of(version: int | None, replicas: dict[str, int]) -> str:
    """The derived status (see the module docstring)."""
    if version is None:
        return "no-version"
    if replicas.get("ready", 0) > 0:
        return "serving"
    if replicas.get("pending", 0) + replicas.get("starting", 0) > 0:
        return "starting"
    return "scaled-to-zero"


def function_row(session: Session, name: str) -> Function:
    """The function ``name``; ``NotFoundError`` when there is none."""
    fn = session.scalars(select(Function).where(Function.name == name)).first()
    if fn is None:
        raise NotFoundError(f"no function {name!r}; deploy it first")
    return fn


def _replica_counts(session: Session, name: str) -> dict[str, int]:
    # Stopped replicas pile up forever; the console shows the ones that matter now.
    states = session.scalars(
        select(Replica.state).where(Replica.function == name, Replica.state != "stopped")
    ).all()
    return dict(Counter(states))


def function_stats(session: Session, name: str, window: int = DEFAULT_WINDOW) -> FunctionStats:
    """Stats of one function over its last ``window`` finished calls."""
    fn = function_row(session, name)
    rows = session.execute(
        select(
            Call.status,
            Call.cold,
            Call.replica_id,
            Call.accepted_at,
            Call.finished_at,
            Call.phases_json,
        )
        .where(Call.function == name, Call.status.in_(FINAL_CALL_STATES))
        .order_by(Call.accepted_at.desc())
        .limit(window)
    ).all()
    ok = [r for r in rows if r.status == "succeeded" and r.finished_at is not None]
    warm = [(r.finished_at - r.accepted_at) * 1000 for r in ok if not r.cold]
    cold = [(r.finished_at - r.accepted_at) * 1000 for r in ok if r.cold]
    dispatched = [r for r in rows if r.replica_id is not None]
    cold_rate = sum(r.cold for r in dispatched) / len(dispatched) if dispatched else None
    replicas = _replica_counts(session, name)
    return FunctionStats(
        name=name,
        version=fn.active_version,
        status=status_of(fn.active_version, replicas),
        replicas=replicas,
        calls=len(rows),
        calls_failed=sum(r.status in ("failed", "timeout", "expired") for r in rows),
        cold_start_rate=cold_rate,
        warm=summarize(warm),
        cold=summarize(cold),
        phase_medians_ms=phase_medians([json.loads(r.phases_json) for r in ok if r.cold]),
    )


def all_function_stats(session: Session, window: int = DEFAULT_WINDOW) -> list[FunctionStats]:
    names = session.scalars(select(Function.name).order_by(Function.name)).all()
    return [function_stats(session, n, window) for n in names]


def recent_calls(
    session: Session, name: str, limit: int = 100, owner_key_id: str | None = None
) -> list[CallView]:
    """The function's latest calls, newest first (at most ``MAX_RECENT_CALLS``); only
    those made by ``owner_key_id`` when given (``services.call_access``)."""
    function_row(session, name)
    query = select(Call).where(Call.function == name)
    if owner_key_id is not None:
        query = query.where(Call.api_key_id == owner_key_id)
    rows = session.scalars(
        query.order_by(Call.accepted_at.desc()).limit(max(1, min(limit, MAX_RECENT_CALLS)))
    ).all()
    return [view(r) for r in rows]
