"""The worker breaker's inputs as the database holds them: only outcomes that say
something about the worker are judged (``services.worker_health.states``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from control_plane.db.models import Base, Call, Replica, Worker
from control_plane.services.worker_health import states

THRESHOLD = 3


@pytest.fixture
def session() -> Iterator[Session]:
    engine = create_engine("sqlite://")
    Base.metadata.create_all(engine)
    with Session(engine) as s:
        s.add(Worker(id="w1", queue="q", registered_at=0.0, last_heartbeat_at=0.0))
        s.add(
            Replica(
                id="r1",
                function="f",
                version=1,
                worker_id="w1",
                device="cpu",
                state="ready",
                created_at=0.0,
            )
        )
        yield s
    engine.dispose()


def finished(session: Session, n: int, status: str, fault: str | None, at: float) -> None:
    for i in range(n):
        session.add(
            Call(
                id=f"{status}-{fault}-{at}-{i}",
                function="f",
                version=1,
                api_key_id="k",
                status=status,
                fault=fault,
                input_json="null",
                timeout_s=60.0,
                replica_id="r1",
                accepted_at=at,
                deadline_at=at + 60,
                finished_at=at + i,
            )
        )
    session.flush()


def test_the_functions_own_failures_never_open_the_breaker(session: Session) -> None:
    finished(session, 1, "succeeded", None, at=10.0)
    finished(session, 6, "failed", "function", at=20.0)  # the caller's bad input
    finished(session, 2, "timeout", None, at=30.0)  # the callers' deadlines
    assert states(session, now=100.0, threshold=THRESHOLD, probe_interval_s=30) == {}


def test_replicas_dying_under_calls_open_it(session: Session) -> None:
    finished(session, 1, "succeeded", None, at=10.0)
    finished(session, 3, "failed", "replica", at=20.0)
    assert states(session, now=25.0, threshold=THRESHOLD, probe_interval_s=30) == {"w1": "open"}
    # Function failures in between neither close nor extend it.
    finished(session, 4, "failed", "function", at=40.0)
    assert states(session, now=60.0, threshold=THRESHOLD, probe_interval_s=30) == {
        "w1": "half_open"
    }
