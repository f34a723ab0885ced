"""A function's health, derived from its active version's recent replica starts.

A start failed when its replica ended ``failed`` without ever being ready (its
``setup`` raised, its import failed, or it did not become ready in time; the
replica's ``error`` says which). The function is ``failing`` while the latest
settled start of its active version is such a failure; a replica of that
version becoming ready afterwards makes it ``ok`` again. A function with no
active version, or whose version has not settled a start yet, is ``ok``.

The decision (:func:`judge`) is pure; :func:`of` reads the two rows it needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sqlalchemy import select
from sqlalchemy.orm import Session

from control_plane.db.models import Replica

HealthState = Literal["ok", "failing"]


@dataclass(frozen=True)
class FailedStart:
    error: str
    at: float  # unix seconds the start was given up
    replica_id: str


@dataclass(frozen=True)
class FunctionHealth:
    state: HealthState
    last_error: str | None = None
    last_error_at: float | None = None
    last_error_replica_id: str | None = None


OK = FunctionHealth("ok")


def judge(last_failed: FailedStart | None, last_ready_at: float | None) -> FunctionHealth:
    """``failing`` when the latest failed start is newer than the latest ready replica."""
    if last_failed is None:
        return OK
    if last_ready_at is not None and last_ready_at >= last_failed.at:
        return OK
    return FunctionHealth("failing", last_failed.error, last_failed.at, last_failed.replica_id)


def of(session: Session, name: str, version: int | None) -> FunctionHealth:
    """The health of ``name`` as of its active ``version`` (None: nothing deployed)."""
    if version is None:
        return OK
    of_version = (Replica.function == name, Replica.version == version)
    failed = session.execute(
        select(Replica.id, Replica.error, Replica.stopped_at, Replica.created_at)
        .where(*of_version, Replica.state == "failed", Replica.ready_at.is_(None))
        .order_by(Replica.created_at.desc())
        .limit(1)
    ).first()
    last_ready_at = session.scalar(
        select(Replica.ready_at)
        .where(*of_version, Replica.ready_at.is_not(None))
        .order_by(Replica.ready_at.desc())
        .limit(1)
    )
    last_failed = None
    if failed is not None:
        replica_id, error, stopped_at, created_at = failed
        at = stopped_at if stopped_at is not None else created_at
        last_failed = FailedStart(error or "the replica failed to start", at, replica_id)
    return judge(last_failed, last_ready_at)
