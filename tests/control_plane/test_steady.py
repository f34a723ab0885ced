"""A reconcile tick's pulse of every function (``services.steady``), read on SQLite and
PostgreSQL: what changes it (a queued call, load that asks for another replica, a
replica's state, a canary, a scaling change) and what does not (calls coming and
going within one replica's capacity); and when a steady function is passed over."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import event, update
from sqlalchemy.engine import Engine

from control_plane.db import migrate
from control_plane.db.models import Call, Canary, Function, FunctionVersion, Replica
from control_plane.db.session import Database
from control_plane.services import steady
from control_plane.spec import FunctionSpec, Scaling
from tests.control_plane.conftest import ControlPlane

BUNDLE = "blake3:" + "0" * 64


def _spec(target_concurrency: int = 4) -> str:
    scaling = Scaling(max_replicas=4, target_concurrency=target_concurrency)
    return FunctionSpec(name="f", bundle=BUNDLE, entry="app:f", scaling=scaling).model_dump_json()


@pytest.fixture
def db(db_url: str) -> Iterator[Database]:
    migrate.upgrade(db_url)
    database = Database(db_url)
    with database.session() as s:
        fn = Function(name="f", active_version=1, created_at=0.0)
        s.add(fn)
        s.flush()
        for version in (1, 2):
            s.add(
                FunctionVersion(
                    function_id=fn.id, version=version, spec_json=_spec(), created_at=0.0
                )
            )
        s.add(Function(name="idle", active_version=None, created_at=0.0))  # never deployed
    yield database
    database.dispose()


def _call(s: object, call_id: str, status: str, version: int = 1) -> None:
    s.add(  # type: ignore[attr-defined]
        Call(
            id=call_id,
            function="f",
            version=version,
            api_key_id="k",
            status=status,
            input_json="{}",
            timeout_s=60.0,
            accepted_at=1.0,
            deadline_at=61.0,
        )
    )


def _pulse(db: Database, breakers: dict[str, str] | None = None) -> steady.Pulse:
    with db.session() as s:
        pulses = steady.read(s, breakers or {})
    assert "idle" not in pulses  # no active version: no pulse, always a full pass
    return pulses["f"]


def test_the_pulse_moves_with_what_a_pass_decides_on(db: Database) -> None:
    quiet = _pulse(db)
    assert quiet.calls == () and quiet.replicas == () and not quiet.queued
    assert [v for v, _, _ in quiet.versions] == [1]

    with db.session() as s:
        _call(s, "c1", "running")
        _call(s, "c2", "dispatched")
    busy = _pulse(db)
    assert busy.calls == ((1, False, 1),)  # two in flight: one replica of capacity 4 asked

    with db.session() as s:
        _call(s, "c3", "running")
        _call(s, "c4", "succeeded")  # final calls are not in the pulse
    assert _pulse(db) == busy  # three in flight: still one replica

    with db.session() as s:
        _call(s, "c5", "running")
        _call(s, "c6", "running")
    assert _pulse(db).calls == ((1, False, 2),)  # five: another replica asked

    with db.session() as s:
        _call(s, "c7", "queued")
    assert _pulse(db).queued

    with db.session() as s:
        s.execute(update(Call).where(Call.status != "succeeded").values(status="succeeded"))
        s.add(
            Replica(
                id="r1",
                function="f",
                version=1,
                worker_id="w",
                device="cpu",
                state="starting",
                created_at=0.0,
            )
        )
    starting = _pulse(db)
    assert starting.replicas == (("r1", 1, "starting", "w"),)
    with db.session() as s:
        s.execute(update(Replica).values(state="ready"))
    assert _pulse(db) != starting
    with db.session() as s:
        s.execute(update(Replica).values(state="stopped"))
    assert _pulse(db).replicas == ()

    assert _pulse(db, {"w": "open"}) != _pulse(db)


def test_a_canary_and_a_scaling_change_move_the_pulse(db: Database) -> None:
    before = _pulse(db)
    with db.session() as s:
        fn_id = s.query(Function.id).filter(Function.name == "f").scalar()
        s.add(Canary(function_id=fn_id, version=2, weight_pct=10.0, started_at=0.0))
    canary = _pulse(db)
    assert [(v, w) for v, w, _ in canary.versions] == [(1, None), (2, 10.0)]
    with db.session() as s:
        s.execute(update(Canary).values(weight_pct=50.0))
    assert _pulse(db) != canary

    with db.session() as s:
        s.execute(update(Canary).values(version=1))  # promoted: one version again
        s.execute(
            update(FunctionVersion).where(FunctionVersion.version == 1).values(spec_json=_spec(8))
        )
    after = _pulse(db)
    assert [v for v, _, _ in after.versions] == [1] and after != before


def _pulse_of(queued: bool = False, asked: int = 1) -> steady.Pulse:
    return steady.Pulse(((1, None, "{}"),), ((1, queued, asked),), (("r", 1, "ready", "w"),), ())


def test_a_steady_function_is_passed_over_between_rechecks() -> None:
    memory = steady.SteadyFunctions()
    pulse = _pulse_of()
    assert not memory.skip("f", pulse)  # never seen: a full pass
    memory.passed("f", pulse, acted=False)
    skipped = [memory.skip("f", pulse) for _ in range(2 * steady.RECHECK_PASSES)]
    # Passed over RECHECK_PASSES - 1 times, then a full pass (which records it anew).
    assert skipped[: steady.RECHECK_PASSES] == [True] * (steady.RECHECK_PASSES - 1) + [False]
    memory.passed("f", pulse, acted=False)
    assert memory.skip("f", pulse)
    assert not memory.skip("f", _pulse_of(asked=2))  # the load asks for more: a full pass


def test_a_pass_that_acted_or_saw_a_queued_call_is_not_steady() -> None:
    memory = steady.SteadyFunctions()
    memory.passed("f", _pulse_of(), acted=True)
    assert not memory.skip("f", _pulse_of())
    memory.passed("f", _pulse_of(queued=True), acted=False)
    assert not memory.skip("f", _pulse_of(queued=True))
    memory.passed("f", _pulse_of(), acted=False)
    memory.forget(["f"])  # a kick
    assert not memory.skip("f", _pulse_of())


def test_ticks_at_rest_pass_over_a_steady_function(cp: ControlPlane) -> None:
    """Served, with a worker and a warm replica: most ticks read only the pulse."""
    worker = cp.worker()
    cp.deploy("echo", scaling={"min_replicas": 1, "max_replicas": 1})
    deadline = time.monotonic() + 10
    while list(worker.replicas.values()) != ["ready"]:
        assert time.monotonic() < deadline, "no ready replica"
        time.sleep(0.02)
    time.sleep(0.3)  # the start's own passes are done
    seen = Counter[str]()

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.startswith("UPDATE locks"):
            seen["passes"] += 1  # each tick or kick takes the reconcile lock first
        elif statement.split()[:3] == ["SELECT", "functions.scale_history_json", "FROM"]:
            seen["full"] += 1  # a function's full pass reads its scaling history

    event.listen(Engine, "before_cursor_execute", count)
    try:
        time.sleep(1.5)
    finally:
        event.remove(Engine, "before_cursor_execute", count)
    assert seen["passes"] >= 10  # ticks every 50 ms
    assert 1 <= seen["full"] <= seen["passes"] / (steady.RECHECK_PASSES - 1)
