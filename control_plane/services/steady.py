"""Which functions a reconcile tick may pass over: nothing its pass reads has changed.

A full pass over a function reads its versions, calls, replicas and scaling history,
about twenty queries; on an installation at rest, or under a steady load, each pass
decides what the one before did. So a tick first reads every function's *pulse*, in
three queries for all of them::

    Pulse = the versions served (number, canary weight, spec as stored)
          + per version: calls queued (any: never steady), and the replicas the
            calls in flight ask for, ceil(in flight / replica capacity)
          + the live replicas (id, version, state, worker)
          + the workers' breakers

and passes over a function when its pulse equals the one its last full pass saw, that
pass did nothing (``Outbox.acted``: no start tried, no drain asked), and fewer than
``RECHECK_PASSES`` ticks went by since it. Time alone also changes decisions (an idle
timeout ends, a stabilization window slides, a worker frees room), so a steady
function is still passed over only ``RECHECK_PASSES - 1`` times in a row: those
decisions come at most that many intervals late. Scaling up never waits: a queued
call, or load that asks for another replica, changes the pulse. A kick forgets the
function's pulse; a process that did not see the kick sees the change in the pulse.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session

from control_plane.db.models import Call, Canary, Function, FunctionVersion, Replica
from control_plane.db.session import one_of
from control_plane.services.autoscaler import load_replicas
from control_plane.services.states import LIVE_REPLICA_STATES, NON_FINAL_CALL_STATES
from control_plane.spec import FunctionSpec

# A steady function still gets a full pass every this many ticks.
RECHECK_PASSES = 4


@dataclass(frozen=True)
class Pulse:
    versions: tuple[tuple[int, float | None, str], ...]  # (version, canary weight, spec)
    calls: tuple[tuple[int | None, bool, int], ...]  # (version, queued, replicas asked)
    replicas: tuple[tuple[str, int, str, str], ...]  # (id, version, state, worker)
    breakers: tuple[tuple[str, str], ...]

    @property
    def queued(self) -> bool:
        return any(queued for _, queued, _ in self.calls)


def read(session: Session, breakers: Mapping[str, str]) -> dict[str, Pulse]:
    """Every function's pulse, by name (a function with no active version has none)."""
    session.flush()  # the reads below run on the connection, past the session
    conn = session.connection()
    specs: dict[str, list[tuple[int, float | None, str]]] = {}
    for name, version, canary, weight, spec in conn.execute(_SERVED):
        specs.setdefault(name, []).append((version, weight if canary == version else None, spec))
    calls = _calls(conn.execute(_NON_FINAL_CALLS).all(), specs)
    live: dict[str, list[tuple[str, int, str, str]]] = {}
    for name, rid, version, state, worker in conn.execute(_LIVE_REPLICAS):
        live.setdefault(name, []).append((rid, version, state, worker))
    shared = tuple(sorted(breakers.items()))
    return {
        name: Pulse(tuple(sorted(served)), calls.get(name, ()), tuple(live.get(name, ())), shared)
        for name, served in specs.items()
    }


# ``read``'s statements, built once (every reconcile tick runs them).
_SERVED = (
    select(Function.name, FunctionVersion.version, Canary.version, Canary.weight_pct)
    .add_columns(FunctionVersion.spec_json)
    .outerjoin(Canary, Canary.function_id == Function.id)
    .join(
        FunctionVersion,
        and_(
            FunctionVersion.function_id == Function.id,
            or_(
                FunctionVersion.version == Function.active_version,
                FunctionVersion.version == Canary.version,
            ),
        ),
    )
)
_NON_FINAL_CALLS = (
    select(Call.function, Call.version, Call.status, func.count(Call.id))
    .where(one_of(Call.status, NON_FINAL_CALL_STATES))
    .group_by(Call.function, Call.version, Call.status)
)
_LIVE_REPLICAS = (
    select(Replica.function, Replica.id, Replica.version, Replica.state, Replica.worker_id)
    .where(one_of(Replica.state, LIVE_REPLICA_STATES))
    .order_by(Replica.function, Replica.id)
)


def _calls(
    rows: Sequence[Any],  # (function, version, status, count)
    specs: dict[str, list[tuple[int, float | None, str]]],
) -> dict[str, tuple[tuple[int | None, bool, int], ...]]:
    per: dict[tuple[str, int | None], list[int]] = {}
    for name, version, status, n in rows:
        counts = per.setdefault((name, version), [0, 0])
        counts[0 if status == "queued" else 1] += int(n)
    capacity = {
        (name, served_version): _capacity(spec)
        for name, served in specs.items()
        for served_version, _, spec in served
    }
    out: dict[str, list[tuple[int | None, bool, int]]] = {}
    for (name, of), (queued, in_flight) in sorted(per.items(), key=_by_version):
        asked = load_replicas(in_flight, capacity.get((name, of or 0), 1))
        out.setdefault(name, []).append((of, queued > 0, asked))
    return {name: tuple(v) for name, v in out.items()}


def _by_version(item: tuple[tuple[str, int | None], list[int]]) -> tuple[str, int]:
    (name, version), _ = item
    return name, -1 if version is None else version


@functools.lru_cache(maxsize=256)
def _capacity(spec_json: str) -> int:
    """The stored spec's ``replica_capacity`` (specs repeat from tick to tick)."""
    return FunctionSpec.model_validate_json(spec_json).replica_capacity


@dataclass
class _Seen:
    pulse: Pulse
    skipped: int = 0


@dataclass
class SteadyFunctions:
    """What each function's last quiet full pass saw (one per reconciler)."""

    _seen: dict[str, _Seen] = field(default_factory=dict)

    def skip(self, name: str, pulse: Pulse) -> bool:
        """Pass ``name`` over this tick (counts the skip)."""
        seen = self._seen.get(name)
        if seen is None or pulse.queued or seen.pulse != pulse:
            return False
        if seen.skipped + 1 >= RECHECK_PASSES:
            return False
        seen.skipped += 1
        return True

    def passed(self, name: str, pulse: Pulse, acted: bool) -> None:
        """A full pass over ``name`` saw ``pulse``; ``acted``: it started or drained."""
        if acted or pulse.queued:
            self._seen.pop(name, None)
        else:
            self._seen[name] = _Seen(pulse)

    def forget(self, names: Iterable[str]) -> None:
        for name in names:
            self._seen.pop(name, None)
