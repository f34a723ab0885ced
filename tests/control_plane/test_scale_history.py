"""The autoscaler's history on the function's row, on SQLite and PostgreSQL: each
serving version keeps its own, a steady recommendation writes nothing, and the
scale-down window holds across separate sessions (as across control-plane
processes). The clock is a number passed in."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import select

from control_plane.db import migrate
from control_plane.db.models import Call, Function
from control_plane.db.session import Database
from control_plane.services import affinity, scale_history
from control_plane.services.autoscaler import Recommendation, ScaleState, Windows

WINDOWS = Windows(scale_up_s=0, scale_down_s=60)


def _state(load: int, current: int) -> ScaleState:
    return ScaleState(
        min_replicas=0,
        max_replicas=8,
        idle_timeout_s=600,
        target_concurrency=1,
        in_flight=load,
        queued=0,
        current_replicas=current,
        last_call_at=0.0,
    )


@pytest.fixture
def db(db_url: str) -> Iterator[Database]:
    migrate.upgrade(db_url)
    database = Database(db_url)
    yield database
    database.dispose()


def test_scale_down_window_holds_across_sessions_per_version(db: Database) -> None:
    with db.session() as s:
        s.add(Function(name="f", active_version=1, created_at=0.0))

    def target(version: int, load: int, current: int, now: float) -> int:
        with db.session() as s:  # a fresh session each time, as another process would
            return scale_history.target(s, "f", version, _state(load, current), WINDOWS, now)

    assert target(1, load=4, current=1, now=0.0) == 4  # a burst: up at once
    assert target(2, load=1, current=0, now=5.0) == 1  # a canary: its own history
    assert target(1, load=1, current=4, now=10.0) == 4  # held by the window
    assert target(1, load=1, current=4, now=69.0) == 4
    assert target(1, load=1, current=4, now=71.0) == 1  # the burst ended at 10
    with db.session() as s:
        assert scale_history.load(s, "f", 2) == (Recommendation(5.0, 1),)
        raw = s.scalar(select(Function.scale_history_json).where(Function.name == "f"))
    with db.session() as s:
        scale_history.target(s, "f", 1, _state(1, 1), WINDOWS, 80.0)  # steady
        assert s.scalar(select(Function.scale_history_json).where(Function.name == "f")) == raw


def test_a_session_is_remembered_by_its_latest_dispatched_call(db: Database) -> None:
    with db.session() as s:
        for i, (session_id, replica, dispatched_at) in enumerate(
            [("s1", "r1", 1.0), ("s1", "r2", 2.0), ("s1", None, None), ("s2", "r3", 3.0)]
        ):
            s.add(
                Call(
                    id=f"c{i}",
                    function="f",
                    version=1,
                    api_key_id="k",
                    status="succeeded" if replica else "queued",
                    input_json="1",
                    session_id=session_id,
                    replica_id=replica,
                    dispatched_at=dispatched_at,
                    timeout_s=1,
                    accepted_at=0,
                    deadline_at=1,
                )
            )
    with db.session() as s:
        assert affinity.session_replica(s, "f", "s1") == "r2"
        assert affinity.session_replica(s, "f", "s2") == "r3"
        assert affinity.session_replica(s, "g", "s1") is None  # another function's session
        assert affinity.session_replica(s, "f", "nobody") is None
