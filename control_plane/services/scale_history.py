"""The autoscaler's recommendation history, kept on the function's row.

``autoscaler.decide`` is pure; this loads its history before a decision and
stores the new one after (only when it changed: a steady recommendation
writes nothing). Each serving version (the active one, a canary) has its
own history, as it scales on its own calls. The reconcile lock serializes
the read-decide-write of every control-plane process, so they all stabilize
over the same window.
"""

from __future__ import annotations

import json

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from control_plane.db.models import Function
from control_plane.services.autoscaler import (
    History,
    Recommendation,
    ScaleState,
    Windows,
    decide,
)
from control_plane.settings import Settings

# {version: [[since, replicas], ...]}
Stored = dict[str, list[list[float]]]


def windows(settings: Settings) -> Windows:
    return Windows(settings.scale_up_window_s, settings.scale_down_window_s)


def _stored(session: Session, function: str) -> Stored:
    raw = session.scalar(select(Function.scale_history_json).where(Function.name == function))
    value = json.loads(raw or "{}")
    return value if isinstance(value, dict) else {}


def load(session: Session, function: str, version: int) -> History:
    entries = _stored(session, function).get(str(version), [])
    return tuple(Recommendation(float(t), int(n)) for t, n in entries)


def save(session: Session, function: str, version: int, history: History) -> None:
    stored = _stored(session, function)
    stored[str(version)] = [[r.since, r.replicas] for r in history]
    session.execute(
        update(Function)
        .where(Function.name == function)
        .values(scale_history_json=json.dumps(stored))
        .execution_options(synchronize_session=False)
    )


def target(
    session: Session, function: str, version: int, state: ScaleState, w: Windows, now: float
) -> int:
    """The stabilized replica target of ``function``'s ``version`` at ``now``; records
    the history."""
    before = load(session, function, version)
    replicas, after = decide(state, before, w, now)
    if after != before:
        save(session, function, version, after)
    return replicas
