"""Canary versions: a new version takes a share of calls, the active one the rest.

::

    thaw deploy DIR --canary 10   the new version is stored as the canary (10 %),
                                  the active version stays active
    each accepted call            pick_version(active, canary, draw): the call keeps
                                  that version to its end (routing, retries, stats)
    thaw canary status NAME       both versions side by side over the same window
    thaw canary promote NAME      the canary becomes the active version
    thaw canary abort NAME        the canary is dropped; new calls all go to the
                                  active version; calls already accepted on the
                                  canary run on it (``finishing``), then its
                                  replicas drain

The choice is a pure function of a uniform draw in [0, 1), injected, so its
split is tested with many draws and no clock or randomness of its own.
Replicas of both versions run at once: the reconciler routes and scales each
serving version on its own calls (``serving``).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, delete, select
from sqlalchemy.orm import Session

from control_plane.db.models import Call, Canary, Function
from control_plane.errors import NotFoundError
from control_plane.services import functions
from control_plane.services.functions import ActiveVersion
from control_plane.services.states import FINAL_CALL_STATES
from control_plane.services.stats import LatencySummary, summarize

DEFAULT_WINDOW = 1000
ERROR_STATES = ("failed", "timeout", "expired")  # cancelled is the caller's choice


@dataclass(frozen=True)
class CanaryState:
    version: int
    weight_pct: float
    started_at: float


def pick_version(active: int, canary: CanaryState | None, draw: float) -> int:
    """The version a call goes to: the canary for draws under its share, else the active."""
    if not 0.0 <= draw < 1.0:
        raise ValueError(f"draw must be in [0, 1), not {draw}")
    if canary is None:
        return active
    return canary.version if draw * 100 < canary.weight_pct else active


def state(session: Session, fn: Function) -> CanaryState | None:
    row = session.get(Canary, fn.id)
    return None if row is None else CanaryState(row.version, row.weight_pct, row.started_at)


def _function(session: Session, name: str) -> Function:
    fn = session.scalars(select(Function).where(Function.name == name)).first()
    if fn is None:
        raise NotFoundError(f"no function {name!r}; deploy it with `thaw deploy DIR`")
    return fn


def serving(session: Session, name: str) -> list[ActiveVersion]:
    """The versions that take calls: the active one, then the canary if any."""
    fn = _function(session, name)
    active = functions.active_of(session, fn)
    canary = state(session, fn)
    if canary is None or canary.version == active.version:
        return [active]
    return [active, functions.version_of(session, fn, canary.version)]


def finishing(session: Session, versions: list[ActiveVersion]) -> list[ActiveVersion]:
    """Versions that no longer take new calls (replaced by a deploy, promoted over,
    aborted, rolled back from) but still hold queued calls: a call keeps the version
    it was accepted on, so these run on that version's replicas before it drains."""
    serving = [fn.version for fn in versions]
    held = session.scalars(
        select(Call.version)
        .where(
            Call.function == versions[0].name,
            Call.status == "queued",
            Call.version.not_in(serving),
        )
        .distinct()
        .order_by(Call.version)
    ).all()
    if not held:
        return []
    fn = _function(session, versions[0].name)
    return [functions.version_of(session, fn, v) for v in held if v is not None]


# ``for_call``'s one read, built once (a statement used again is not built and keyed anew).
_FOR_CALL = (
    select(
        Function.id,
        Function.created_at,
        Function.active_version,
        Canary.version,
        Canary.weight_pct,
        Canary.started_at,
    )
    .outerjoin(Canary, Canary.function_id == Function.id)
    .where(Function.name == bindparam("name"))
)


def for_call(
    session: Session,
    name: str,
    versions: functions.VersionCache,
    draw: Callable[[], float] = random.random,
) -> ActiveVersion:
    """The version a new call of ``name`` is accepted on (one read of the function
    and its canary per session: a burst's accepts, taken in one transaction, read it
    once; each call draws its own version). Raises ``NotFoundError``."""
    read: dict[str, Any] = session.info.setdefault("for_call", {})
    found = read.get(name)
    if found is None:
        found = session.connection().execute(_FOR_CALL, {"name": name}).first()
        if found is None:
            raise NotFoundError(f"no function {name!r}; deploy it with `thaw deploy DIR`")
        read[name] = found
    fn_id, created_at, active, canary_version, weight_pct, started_at = found
    if active is None:
        raise NotFoundError(f"function {name} has no active version; deploy it")
    canary = None
    if canary_version is not None:
        canary = CanaryState(canary_version, weight_pct, started_at)
    version = pick_version(active, canary, draw())
    return versions.version_of(session, functions.FunctionKey(fn_id, created_at, name), version)


def _require(session: Session, name: str) -> tuple[Function, CanaryState]:
    fn = _function(session, name)
    canary = state(session, fn)
    if canary is None:
        raise NotFoundError(
            f"function {name} has no canary; deploy one with `thaw deploy DIR --canary 10`"
        )
    return fn, canary


def promote(session: Session, name: str) -> functions.FunctionInfo:
    """Make the canary the active version. Raises ``NotFoundError`` without a canary."""
    fn, canary = _require(session, name)
    fn.active_version = canary.version
    session.execute(delete(Canary).where(Canary.function_id == fn.id))
    session.flush()
    return functions.show(session, name)


def abort(session: Session, name: str) -> functions.FunctionInfo:
    """Drop the canary; its replicas drain once idle (the reconciler)."""
    fn, _ = _require(session, name)
    session.execute(delete(Canary).where(Canary.function_id == fn.id))
    session.flush()
    return functions.show(session, name)


@dataclass(frozen=True)
class VersionStats:
    version: int
    calls: int
    error_rate: float | None
    cold_start_rate: float | None
    latency: LatencySummary
    first_output: LatencySummary  # accepted → first output (first streamed chunk, else result)


@dataclass(frozen=True)
class CanaryStatus:
    function: str
    weight_pct: float
    started_at: float
    active: VersionStats
    canary: VersionStats


def status(session: Session, name: str, window: int = DEFAULT_WINDOW) -> CanaryStatus:
    """Both versions' calls accepted since the canary began (the latest ``window`` of each)."""
    fn, canary = _require(session, name)
    assert fn.active_version is not None
    return CanaryStatus(
        name,
        canary.weight_pct,
        canary.started_at,
        version_stats(session, name, fn.active_version, canary.started_at, window),
        version_stats(session, name, canary.version, canary.started_at, window),
    )


def version_stats(
    session: Session, name: str, version: int, since: float, window: int = DEFAULT_WINDOW
) -> VersionStats:
    rows = session.execute(
        select(Call.status, Call.cold, Call.replica_id, Call.accepted_at)
        .add_columns(Call.first_output_at, Call.finished_at)
        .where(
            Call.function == name,
            Call.version == version,
            Call.accepted_at >= since,
            Call.status.in_(FINAL_CALL_STATES),
        )
        .order_by(Call.accepted_at.desc())
        .limit(window)
    ).all()
    ok = [r for r in rows if r.status == "succeeded" and r.finished_at is not None]
    reached = [r for r in rows if r.replica_id is not None]
    first = [(r.first_output_at or r.finished_at) - r.accepted_at for r in ok]
    return VersionStats(
        version=version,
        calls=len(rows),
        error_rate=_share(sum(r.status in ERROR_STATES for r in rows), len(rows)),
        cold_start_rate=_share(sum(bool(r.cold) for r in reached), len(reached)),
        latency=summarize([(r.finished_at - r.accepted_at) * 1000 for r in ok]),
        first_output=summarize([s * 1000 for s in first]),
    )


def _share(n: int, of: int) -> float | None:
    return n / of if of else None
