"""A Hypothesis state machine over the call lifecycle on a real (in-memory SQLite)
database: whatever order worker events, cancels, deadlines and lost workers come
in, a call reaches exactly one final state and never leaves it."""

from __future__ import annotations

from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from sqlalchemy import create_engine, update
from sqlalchemy.orm import Session
from sqlalchemy.pool import StaticPool

from control_plane.db.models import Base, Call
from control_plane.errors import ConflictError
from control_plane.protocol import CallEvent, CallEventKind, TokenUsage
from control_plane.services import calls
from control_plane.services.states import FINAL_CALL_STATES


def _call(**fields: Any) -> Call:
    """Call "c" of function "f" (one retry), accepted at 0; ``fields`` set the rest."""
    base: dict[str, Any] = {
        "id": "c",
        "function": "f",
        "version": 1,
        "api_key_id": "k",
        "input_json": "null",
        "retries": 1,
        "accepted_at": 0,
    }
    return Call(**{**base, **fields})


class CallLifecycle(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        engine = create_engine("sqlite://", poolclass=StaticPool)
        Base.metadata.create_all(engine)
        self.session = Session(engine)
        self.session.add(_call(status="queued", timeout_s=1, deadline_at=1))
        self.session.commit()
        self.final: str | None = None
        self.wins = 0
        self.now = 0.0

    def _row(self) -> Call:
        row = self.session.get(Call, "c")
        assert row is not None
        self.session.refresh(row)
        return row

    def _end(self, won: bool, status: str) -> None:
        self.session.commit()
        if won:
            self.wins += 1
            self.final = status

    @rule()
    def dispatch(self) -> None:
        self.session.execute(
            update(Call).where(Call.id == "c", Call.status == "queued").values(status="dispatched")
        )
        self.session.commit()

    @rule(
        kind=st.sampled_from(["started", "output", "succeeded", "failed", "timeout", "cancelled"]),
        stale=st.booleans(),
    )
    def worker_event(self, kind: CallEventKind, stale: bool) -> None:
        attempt = self._row().attempt + (1 if stale else 0)
        before = self._row().status
        try:
            calls.record_event(
                self.session, None, self.now, "c", CallEvent(attempt=attempt, kind=kind)
            )
        except ConflictError:
            self.session.rollback()
            assert before in FINAL_CALL_STATES or stale
            return
        assert not stale and before not in FINAL_CALL_STATES
        self._end(kind in FINAL_CALL_STATES, kind)

    @rule(status=st.sampled_from(FINAL_CALL_STATES))
    def someone_ends_it(self, status: str) -> None:
        self.now += 0.1
        self._end(calls.finalize(self.session, None, self.now, "c", status) is not None, status)

    @rule()
    def deadline_passes(self) -> None:
        before = self._row().status
        self.now += 0.1
        won = calls.end_at_deadline(self.session, None, self.now, "c")
        status = self._row().status
        self._end(won, status)
        if won:  # expired only if it never left the queue
            assert status == ("expired" if before == "queued" else "timeout")

    @rule()
    def worker_lost(self) -> None:
        row = self._row()
        if row.status in ("dispatched", "running"):
            calls.requeue_or_fail(self.session, None, self.now, row, "lost")
            self.session.commit()
            if self._row().status == "failed":
                self._end(True, "failed")

    @invariant()
    def one_final_state_forever(self) -> None:
        status = self._row().status
        assert self.wins <= 1
        if self.final is not None:
            assert status == self.final
        else:
            assert status not in FINAL_CALL_STATES


CallLifecycle.TestCase.settings = settings(max_examples=60, stateful_step_count=20, deadline=None)
TestCallLifecycle = CallLifecycle.TestCase


def _two_sessions() -> tuple[Session, Session]:
    engine = create_engine("sqlite://", poolclass=StaticPool)
    Base.metadata.create_all(engine)
    with Session(engine) as s:
        s.add(_call(status="dispatched", timeout_s=60, deadline_at=60, replica_id="r1"))
        s.commit()
    return Session(engine), Session(engine)


def test_a_late_event_of_a_requeued_attempt_moves_nothing() -> None:
    """The worker's events of attempt 1 are read against attempt 1, then the call is
    requeued (its worker taken for lost) before they write: the new attempt stays
    queued instead of running on no replica until its deadline."""
    worker, reconciler = _two_sessions()
    stale = worker.get(Call, "c")  # the event's read: attempt 1, dispatched
    assert stale is not None and stale.attempt == 1
    fresh = reconciler.get(Call, "c")
    assert fresh is not None
    calls.requeue_or_fail(reconciler, None, 1.0, fresh, "worker w1 stopped heartbeating")
    reconciler.commit()
    calls.record_event(worker, None, 2.0, "c", CallEvent(attempt=1, kind="started"))
    try:
        calls.record_event(worker, None, 2.0, "c", CallEvent(attempt=1, kind="succeeded"))
    except ConflictError as exc:
        assert "past attempt 1" in str(exc)
    else:
        raise AssertionError("a final event of a requeued attempt was recorded")
    worker.commit()
    reconciler.expire_all()
    row = reconciler.get(Call, "c")
    assert row is not None
    assert (row.status, row.attempt, row.replica_id) == ("queued", 2, None)


def test_an_event_says_whether_calls_of_its_function_wait_for_its_slot(db_url: str) -> None:
    """A call that ends, or goes back to the queue unrun, frees a slot: the recorder
    reconciles the function if calls of it (of any version) are queued. On SQLite
    and PostgreSQL: the answer is a subquery in ``finalize``'s RETURNING."""
    engine = create_engine(db_url)
    Base.metadata.create_all(engine)
    with Session(engine) as s:
        for cid in ("a", "b", "c"):
            s.add(_call(id=cid, status="dispatched", timeout_s=60, deadline_at=60, replica_id="r1"))
        other = _call(id="o", function="g", status="queued", timeout_s=60, deadline_at=60)
        s.add(other)
        s.commit()
        started = CallEvent(attempt=1, kind="started")
        assert calls.record_event(s, None, 1.0, "a", started) is False
        assert (
            calls.record_event(s, None, 1.0, "a", CallEvent(attempt=1, kind="succeeded")) is False
        )
        unrun = CallEvent(attempt=1, kind="failed", not_run=True)
        assert calls.record_event(s, None, 1.0, "b", unrun) is True  # "b" itself waits now
        assert calls.record_event(s, None, 1.0, "c", CallEvent(attempt=1, kind="failed")) is True
        s.execute(update(Call).where(Call.id == "b").values(status="cancelled"))
        ended = calls.finalize(s, None, 1.0, "b", "timeout", from_states=("cancelled",))
        assert ended is not None and ended.queued_behind is False  # only "g" waits
    engine.dispose()


def test_a_stale_requeue_does_not_requeue_the_next_attempt_again() -> None:
    first, second = _two_sessions()
    a = first.get(Call, "c")
    b = second.get(Call, "c")
    assert a is not None and b is not None
    calls.requeue_or_fail(first, None, 1.0, a, "replica r1 ended")
    first.commit()
    first.execute(update(Call).where(Call.id == "c").values(status="dispatched", replica_id="r2"))
    first.commit()
    calls.requeue_or_fail(second, None, 2.0, b, "worker w1 stopped heartbeating")  # read earlier
    second.commit()
    first.expire_all()
    row = first.get(Call, "c")
    assert row is not None
    assert (row.status, row.attempt, row.replica_id) == ("dispatched", 2, "r2")


def test_a_final_event_keeps_an_llm_calls_tokens_in_its_record() -> None:
    """``usage`` on the final event, succeeded or failed, is kept in the call's record;
    a call whose end carried none reads back None."""
    engine = create_engine("sqlite://", poolclass=StaticPool)
    Base.metadata.create_all(engine)
    with Session(engine) as s:
        for cid in ("ok", "failed", "plain"):
            s.add(_call(id=cid, status="running", timeout_s=60, deadline_at=60, replica_id="r1"))
        s.commit()
        counted = TokenUsage(prompt_tokens=12, completion_tokens=30)
        succeeded = CallEvent(attempt=1, kind="succeeded", usage=counted)
        failed = CallEvent(attempt=1, kind="failed", error="boom", usage=counted)
        calls.record_event(s, None, 1.0, "ok", succeeded)
        calls.record_event(s, None, 1.0, "failed", failed)
        calls.record_event(s, None, 1.0, "plain", CallEvent(attempt=1, kind="succeeded"))
        s.commit()
    with Session(engine) as s:
        assert calls.get(s, "ok").usage == counted
        assert calls.get(s, "failed").usage == counted
        assert calls.get(s, "plain").usage is None
    engine.dispose()
