"""Calls: accepted once, ended once.

    queued ──▶ dispatched ──▶ running ──▶ succeeded | failed | timeout | cancelled
      │ ▲          │             │
      │ └──────────┴─────────────┘  re-queued (attempt + 1) when the worker is lost
      │                             and retries remain
      └──▶ expired                  the deadline passed before it ever left the queue

Every transition is a guarded ``UPDATE ... WHERE status IN (...)``; the
final one only from a non-final state, so concurrent enders (the worker's
result, a cancel, the deadline, a lost worker) race safely and exactly one
wins. Functions here take an open session and do not commit; the caller
commits and then wakes waiters (``services.invocations``).
"""

from __future__ import annotations

import contextlib
import functools
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Table, Update, bindparam, case, func, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, make_transient_to_detached
from sqlalchemy.orm.attributes import set_committed_value

from control_plane.db.models import Call, CallOutput, Replica
from control_plane.db.session import hold, one_of
from control_plane.errors import BadRequestError, ConflictError, NotFoundError
from control_plane.metrics import Metrics
from control_plane.protocol import CallEvent, TokenUsage
from control_plane.services import catalog, coldstart
from control_plane.services.functions import ActiveVersion
from control_plane.services.keys import Principal
from control_plane.services.llm_metrics import observe_llm_call
from control_plane.services.states import (
    FINAL_CALL_STATES,
    IN_FLIGHT_CALL_STATES,
    NON_FINAL_CALL_STATES,
)
from snapshotter.registry import Registry

# The calls table, for Core statements on the hot path: an ORM-enabled UPDATE
# costs about three times as much to run, for nothing a guarded one needs.
CALLS = cast(Table, Call.__table__)
BEFORE_RUNNING = ("queued", "dispatched")  # a call's states before it runs


@dataclass(frozen=True)
class CallRequest:
    input: Any
    adapter: str | None = None
    stream: bool = False
    idempotency_key: str | None = None
    deadline_ms: float | None = None
    session_id: str | None = None  # X-Thaw-Session: route to the session's last replica


@dataclass(frozen=True)
class CallView:
    id: str
    function: str
    version: int
    status: str
    attempt: int
    input: Any
    output: Any
    error: str | None
    adapter: str | None
    stream: bool
    cold: bool
    replica_id: str | None
    phases_ms: dict[str, float]
    timings_ms: dict[str, float]
    accepted_at: float
    deadline_at: float
    finished_at: float | None
    usage: TokenUsage | None = None  # an LLM call's tokens; None: it counted none
    worker: str | None = None  # the name of the replica's worker (``call_access`` fills it)

    @property
    def final(self) -> bool:
        return self.status in FINAL_CALL_STATES


def view(row: Call) -> CallView:
    return CallView(
        id=row.id,
        function=row.function,
        version=row.version,
        status=row.status,
        attempt=row.attempt,
        input=json.loads(row.input_json),
        output=json.loads(row.output_json) if row.output_json is not None else None,
        error=row.error,
        adapter=row.adapter,
        stream=row.stream,
        cold=row.cold,
        replica_id=row.replica_id,
        phases_ms=json.loads(row.phases_json),
        timings_ms=json.loads(row.timings_json),
        accepted_at=row.accepted_at,
        deadline_at=row.deadline_at,
        finished_at=row.finished_at,
        usage=TokenUsage.model_validate_json(row.usage_json) if row.usage_json else None,
    )


def _canonical(value: Any) -> str:
    """Strict JSON (no NaN/Infinity, which no JSON client could read back)."""
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except ValueError as exc:
        raise BadRequestError(f"inputs and outputs must be strict JSON: {exc}") from None


@contextlib.contextmanager
def accepting(
    session: Session,
    now: float,
    who: Principal,
    fn: ActiveVersion,
    req: CallRequest,
    registry: Registry | None = None,
) -> Iterator[tuple[Call, bool]]:
    """Record a call as queued; with an idempotency key, find the existing one.

    Yields (call, created); a new call is written when the block ends without an
    error, so routing it in the block (``dispatching.mark_dispatched``) changes
    it before it is written: a call taken at once is one INSERT (a Core one:
    the ORM's unit of work costs several times as much for one row). Raises
    ``ConflictError`` when the key was used with a different input,
    ``BadRequestError`` for an adapter that is neither listed by the function
    nor in ``registry`` (the replica loads an unlisted one on first use).

    A call with a key is inserted at once, to find out whether another request
    with the same key won: its transaction is then rolled back and the winner's
    call yielded, so the session must hold no other pending writes. No
    savepoint: on SQLite the driver would commit it on release, and the
    reconciler could dispatch the call before the caller's transaction ends.
    """
    check_request(who, fn, req, registry)
    input_json = _canonical(req.input)
    if req.idempotency_key is not None:
        yield _accept_once(session, now, who, fn, req, input_json)
        return
    row = _new_call(now, who, fn, req, input_json)
    yield row, True
    written = {c.key: getattr(row, c.key) for c in CALLS.columns}  # unset ones: None
    session.connection().execute(insert(CALLS), written)
    note_written(row, written)  # every column present: as if it had been read,
    make_transient_to_detached(row)  # so a later session may take it in unread


def check_request(
    who: Principal, fn: ActiveVersion, req: CallRequest, registry: Registry | None = None
) -> None:
    """What ``accepting`` refuses before it writes anything (see there)."""
    who.require("invoke", fn.name)
    if req.adapter is not None and req.adapter not in {a.name for a in fn.adapters}:
        _check_unlisted_adapter(registry, fn, req.adapter)


def _accept_once(
    session: Session,
    now: float,
    who: Principal,
    fn: ActiveVersion,
    req: CallRequest,
    input_json: str,
) -> tuple[Call, bool]:
    """A call with an idempotency key: the existing one, or a new one written now."""
    existing = _by_idempotency(session, fn.name, who.key_id, req.idempotency_key)
    if existing is not None:
        return _same_or_conflict(existing, input_json), False
    row = _new_call(now, who, fn, req, input_json)
    session.add(row)
    try:
        session.flush()
    except IntegrityError:
        # Another request with the same idempotency key won the insert.
        session.rollback()
        existing = _by_idempotency(session, fn.name, who.key_id, req.idempotency_key)
        if existing is None:
            raise
        return _same_or_conflict(existing, input_json), False
    hold(session, [row])  # routing it in this session reads nothing
    return row, True


def _check_unlisted_adapter(registry: Registry | None, fn: ActiveVersion, ref: str) -> None:
    known = ", ".join(a.name for a in fn.adapters) or "none"
    if fn.loads_adapters is False:
        raise BadRequestError(
            f"function {fn.name} cannot load adapter {ref!r}: its class {fn.spec.entry} "
            f"defines no load_adapter(self, adapter), and it lists {known}; name a listed "
            "adapter, list this one under [[adapters]] in thaw.toml, or add load_adapter"
        )
    if registry is None:
        raise BadRequestError(f"function {fn.name} has no adapter {ref!r} (it lists {known})")
    try:
        catalog.resolve_adapter(registry, ref)
    except BadRequestError as exc:
        raise BadRequestError(
            f"function {fn.name} does not list adapter {ref!r} (it lists {known}) and the "
            f"store cannot give it: {exc}"
        ) from None


def _new_call(
    now: float, who: Principal, fn: ActiveVersion, req: CallRequest, input_json: str
) -> Call:
    timeout_s = fn.spec.timeout_s
    if req.deadline_ms is not None:
        timeout_s = min(timeout_s, req.deadline_ms / 1000)
    return Call(
        id=uuid.uuid4().hex,
        function=fn.name,
        version=fn.version,
        api_key_id=who.key_id,
        idempotency_key=req.idempotency_key,
        status="queued",
        input_json=input_json,
        adapter=req.adapter,
        session_id=req.session_id,
        stream=req.stream,
        attempt=1,
        retries=fn.spec.retries,
        cold=False,
        cancel_pending=False,
        timeout_s=timeout_s,
        accepted_at=now,
        deadline_at=now + timeout_s,
        phases_json="{}",
        timings_json="{}",
    )


def _by_idempotency(session: Session, fn: str, key_id: str, key: str | None) -> Call | None:
    return session.scalars(
        select(Call).where(
            Call.function == fn, Call.api_key_id == key_id, Call.idempotency_key == key
        )
    ).first()


def _same_or_conflict(row: Call, input_json: str) -> Call:
    if row.input_json != input_json:
        raise ConflictError(
            f"Idempotency-Key was already used for call {row.id} with a different input; "
            "use a new key for a new call"
        )
    return row


def get_row(session: Session, call_id: str) -> Call:
    row = session.get(Call, call_id)
    if row is None:
        raise NotFoundError(f"no call {call_id!r}")
    hold(session, [row])  # read once per session
    return row


def get(session: Session, call_id: str) -> CallView:
    return view(get_row(session, call_id))


def outputs_after(
    session: Session, call_id: str, attempt: int, after_seq: int
) -> list[tuple[int, Any]]:
    """Streamed chunks of ``attempt`` with ``seq > after_seq``, in order."""
    rows = session.execute(
        select(CallOutput.seq, CallOutput.output_json)
        .where(
            CallOutput.call_id == call_id,
            CallOutput.attempt == attempt,
            CallOutput.seq > after_seq,
        )
        .order_by(CallOutput.seq)
    ).all()
    return [(seq, json.loads(out)) for seq, out in rows]


def finalize(
    session: Session,
    metrics: Metrics | None,
    now: float,
    call_id: str,
    status: str,
    *,
    output: Any = None,
    error: str | None = None,
    timings_ms: dict[str, float] | None = None,
    adapter_hit: bool | None = None,
    from_states: tuple[str, ...] = NON_FINAL_CALL_STATES,
    attempt: int | None = None,
    fault: str | None = None,
    usage: TokenUsage | None = None,
    token_gaps_ms: list[float] | None = None,
) -> Ended | None:
    """Move a call to final ``status`` if it is in one of ``from_states`` (by default
    any non-final state) and, given ``attempt``, still on that attempt. What the
    call was when this won; None when it did not. ``usage``: the tokens its worker
    reported with the end (an LLM call's), whatever the status; ``token_gaps_ms``
    its inter-token gaps (observed, not stored).

    The winner also completes the call's books: ``total`` (as the control
    plane measured it, unless the worker reported one), a cold call's
    ``first_output`` phase, and the metrics.
    """
    assert status in FINAL_CALL_STATES, status
    values: dict[str, Any] = {
        "status": status,
        "finished_at": now,
        "output_json": _canonical(output) if status == "succeeded" else None,
        "error": error,
        "fault": fault if status == "failed" else None,
        "usage_json": usage.model_dump_json() if usage is not None else None,
    }
    if timings_ms:
        row = session.get(Call, call_id)
        merged = {**(json.loads(row.timings_json) if row else {}), **timings_ms}
        values["timings_json"] = json.dumps(merged)
    # A worker may still be running it: tell the worker (heartbeat reply) to stop.
    stop_worker = status in ("timeout", "cancelled")
    if not stop_worker:
        values["cancel_pending"] = False
    stmt = _finalize_statement(tuple(values), stop_worker, attempt is not None, from_states)
    params = {f"new_{k}": v for k, v in values.items()}  # a column's own name would be SET
    params["call_id"] = call_id
    if attempt is not None:
        params["of_attempt"] = attempt
    returned = session.connection().execute(stmt, params).one_or_none()
    if returned is None:
        return None
    ended = Ended(*returned)
    loaded = session.identity_map.get(session.identity_key(Call, call_id))
    if loaded is not None:  # this session's copy, as written (no re-read)
        note_written(loaded, values)
        if stop_worker:
            session.expire(loaded, ["cancel_pending"])  # computed by the database
    _complete_books(session, metrics, now, call_id, status, adapter_hit, ended)
    if metrics is not None:
        timings = json.loads(ended.timings_json)  # as written (RETURNING)
        latency_s = now - ended.accepted_at
        observe_llm_call(
            metrics.llm, ended.function, ended.cold, latency_s, timings, usage, token_gaps_ms
        )
    return ended


@functools.cache
def _finalize_statement(
    columns: tuple[str, ...], stop_worker: bool, by_attempt: bool, from_states: tuple[str, ...]
) -> Update:
    """``finalize``'s guarded UPDATE ... RETURNING, built once per shape (a statement
    used again skips building and keying it): ``columns`` set from parameters of
    those names prefixed ``new_``; ``stop_worker``: ``cancel_pending`` if it was in flight."""
    c = CALLS.c
    values: dict[str, Any] = {name: bindparam(f"new_{name}") for name in columns}
    if stop_worker:
        values["cancel_pending"] = case(
            (one_of(c.status, IN_FLIGHT_CALL_STATES), True), else_=False
        )
    where = [c.id == bindparam("call_id"), one_of(c.status, from_states)]
    if by_attempt:
        where.append(c.attempt == bindparam("of_attempt"))
    # Not correlated with the updated row: SQLite's RETURNING drops table names,
    # which would leave ``function = function``. Each name below resolves within its
    # own subquery, qualified or not.
    me, queued = CALLS.alias("me"), CALLS.alias("queued")
    function = select(me.c.function).where(me.c.id == bindparam("call_id")).scalar_subquery()
    queued_behind = (
        select(queued.c.id).where(queued.c.function == function, queued.c.status == "queued")
    ).exists()
    return (
        update(CALLS)
        .where(*where)
        .values(**values)
        .returning(c.function, c.accepted_at, c.cold, c.adapter, c.timings_json, queued_behind)
    )


def note_written(row: Call, values: dict[str, Any]) -> None:
    """Make ``row`` (this session's copy) show what an UPDATE of ``values`` wrote."""
    for name, value in values.items():
        set_committed_value(row, name, value)


def end_at_deadline(session: Session, metrics: Metrics | None, now: float, call_id: str) -> bool:
    """End a call whose deadline passed: ``expired`` if it never left the queue, else
    ``timeout``. True if this ended it (False: it was already final)."""
    never_started = (
        "the call's deadline passed while it was still queued (no replica took it in time); "
        "send it with a longer deadline or add capacity"
    )
    if finalize(
        session, metrics, now, call_id, "expired", error=never_started, from_states=("queued",)
    ):
        return True
    error = "the call's deadline passed"
    return finalize(session, metrics, now, call_id, "timeout", error=error) is not None


@dataclass(frozen=True)
class Ended:
    """What ``finalize``'s UPDATE returned of the call it ended."""

    function: str
    accepted_at: float
    cold: bool
    adapter: str | None
    timings_json: str
    queued_behind: bool  # calls of its function wait for a replica: one may take its slot


def _complete_books(
    session: Session,
    metrics: Metrics | None,
    now: float,
    call_id: str,
    status: str,
    adapter_hit: bool | None,
    ended: Ended,
) -> None:
    timings = json.loads(ended.timings_json)
    if "total" not in timings:
        timings["total"] = max(0.0, now - ended.accepted_at) * 1000
        values = {"timings_json": json.dumps(timings)}
        session.execute(
            update(Call)
            .where(Call.id == call_id)
            .values(**values)
            .execution_options(synchronize_session=False)
        )
        loaded = session.identity_map.get(session.identity_key(Call, call_id))
        if loaded is not None:
            note_written(loaded, values)
    if ended.cold:  # the first output phase, on the call and on its replica's first call
        row = session.get(Call, call_id)
        replica = session.get(Replica, row.replica_id) if row and row.replica_id else None
        if row is not None:
            coldstart.complete_cold_call(metrics, row, replica)
            session.flush()
    coldstart.observe_call(metrics, ended.function, ended.cold, timings, ended.adapter, adapter_hit)
    if metrics is not None:
        metrics.call_latency_s.labels(ended.function, str(ended.cold).lower(), status).observe(
            max(0.0, now - ended.accepted_at)
        )


def record_event(
    session: Session, metrics: Metrics | None, now: float, call_id: str, ev: CallEvent
) -> bool:
    """Apply a worker's event; whether calls of the function now wait in the queue
    after it ended or requeued this one (then a slot is free for them: reconcile).
    Raises ``ConflictError`` (409) once the call is final.

    Every update is guarded by the event's attempt as well as by the read above:
    the call may have been requeued (its worker taken for lost) in between, and a
    late event of the old attempt must not move the new one.
    """
    row = get_row(session, call_id)
    if row.status in FINAL_CALL_STATES:
        raise ConflictError(f"call {call_id} is already {row.status}; stop sending for it")
    if ev.attempt != row.attempt:
        raise ConflictError(f"call {call_id} is on attempt {row.attempt}, not {ev.attempt}")
    if ev.kind == "started":
        session.connection().execute(_STARTED, {"call_id": call_id, "of_attempt": ev.attempt})
        return False
    if ev.kind == "output":
        if ev.seq is None:  # an older worker: each chunk after the last one
            for chunk in ev.chunks():
                _add_output(session, metrics, now, row, chunk, None)
        else:
            _add_outputs(session, metrics, now, row, ev.seq, ev.chunks())
        return False
    if ev.kind == "failed" and (ev.not_run or ev.fault == "replica"):
        _stop_routing_to(session, row.replica_id)
    if ev.kind == "failed" and ev.not_run:
        # It never ran (its replica was gone when it arrived): a new attempt that
        # spends no retry, or a call routed just before its replica's death was
        # known would use up the retries its function gave it for failures.
        session.execute(
            update(Call)
            .where(
                Call.id == call_id,
                Call.attempt == ev.attempt,
                Call.status.in_(IN_FLIGHT_CALL_STATES),
            )
            .values(
                status="queued", attempt=row.attempt + 1, retries=row.retries + 1, replica_id=None
            )
            .execution_options(synchronize_session=False)
        )
        return True
    if ev.kind == "failed" and ev.fault == "replica":
        # Its replica died under it: run it again while its function allows retries.
        error = ev.error or "its replica died during the call"
        requeue_or_fail(session, metrics, now, row, error, fault="replica")
        return True
    if ev.loaded_adapters is not None and row.replica_id is not None:
        _note_adapters(session, row.replica_id, ev.loaded_adapters)
    ended = finalize(
        session,
        metrics,
        now,
        call_id,
        ev.kind,
        output=ev.output,
        error=ev.error,
        timings_ms=ev.timings_ms,
        adapter_hit=ev.adapter_hit,
        attempt=ev.attempt,
        fault=ev.fault or "function",
        usage=ev.usage,
        token_gaps_ms=ev.token_gaps_ms,
    )
    if ended is None:
        raise ConflictError(
            f"call {call_id} is already final or past attempt {ev.attempt}; stop sending for it"
        )
    return ended.queued_behind


# A start's guarded UPDATE, built once: a statement built per event costs its building
# and keying again, more than its execution (every streamed call starts).
_STARTED = (
    update(CALLS)
    .where(
        CALLS.c.id == bindparam("call_id"),
        CALLS.c.attempt == bindparam("of_attempt"),
        one_of(CALLS.c.status, BEFORE_RUNNING),
    )
    .values(status="running")
)


def _stop_routing_to(session: Session, replica_id: str | None) -> None:
    """A call says its replica died (or was gone when it came): route nothing more to
    it. Its worker reports the replica failed once the calls it held are accounted
    for; until then a requeued call must not be sent back to it, where each return
    would cost it a retry. ``draining`` is not routed and not counted as live, so
    the reconciler starts a replacement; a replica that was alive after all is
    stopped at its worker's next heartbeat."""
    if replica_id is None:
        return
    session.execute(
        update(Replica)
        .where(Replica.id == replica_id, Replica.state == "ready")
        .values(state="draining")
        .execution_options(synchronize_session=False)
    )


def requeue_or_fail(
    session: Session,
    metrics: Metrics | None,
    now: float,
    call: Call,
    reason: str,
    *,
    fault: str = "replica",
) -> None:
    """A call whose replica vanished: run it again if retries remain, else fail it
    (with ``fault``). Only while it is still on the attempt ``call`` was read at
    (another path may have requeued it, and dispatched the next attempt, since)."""
    if call.attempt <= call.retries:
        session.execute(
            update(Call)
            .where(
                Call.id == call.id,
                Call.attempt == call.attempt,
                Call.status.in_(IN_FLIGHT_CALL_STATES),
            )
            .values(status="queued", attempt=call.attempt + 1, replica_id=None)
            .execution_options(synchronize_session=False)
        )
    else:
        finalize(
            session,
            metrics,
            now,
            call.id,
            "failed",
            error=reason,
            attempt=call.attempt,
            fault=fault,
        )


def _note_adapters(session: Session, replica_id: str, names: list[str]) -> None:
    """What the replica holds now (its adapters loaded on first use included), for
    the router's adapter preference."""
    session.execute(
        update(Replica)
        .where(Replica.id == replica_id)
        .values(adapters_json=json.dumps(sorted(set(names))))
        .execution_options(synchronize_session=False)
    )


def _add_outputs(
    session: Session,
    metrics: Metrics | None,
    now: float,
    row: Call,
    first_seq: int,
    outs: list[Any],
) -> None:
    """Store chunks ``first_seq``, ``first_seq + 1``, ... in one insert; those already
    stored (a retried post, or two posts at once) are skipped by the unique key."""
    if not outs:
        return
    rows = [
        {"call_id": row.id, "attempt": row.attempt, "seq": seq, "output_json": _canonical(out)}
        for seq, out in enumerate(outs, first_seq)
    ]
    connection = session.connection()
    connection.execute(_insert_new_outputs(connection.dialect.name), rows)
    _note_output(session, metrics, now, row)  # idempotent: a repeat changes nothing


@functools.cache
def _insert_new_outputs(dialect: str) -> Any:
    """``INSERT ... ON CONFLICT (call_id, attempt, seq) DO NOTHING`` in ``dialect``
    (SQLite or PostgreSQL), built once: one statement instead of a read of the stored
    places and an ORM bulk insert."""
    table = cast(Table, CallOutput.__table__)
    keys = ["call_id", "attempt", "seq"]
    if dialect == "postgresql":
        return postgresql.insert(table).on_conflict_do_nothing(index_elements=keys)
    return sqlite.insert(table).on_conflict_do_nothing(index_elements=keys)


def _note_output(session: Session, metrics: Metrics | None, now: float, row: Call) -> None:
    """The call has an output: its first-output time (once), and it is running, unless
    it ended meanwhile: ``row`` is as the run last saw it (a call cancelled since, its
    client gone, keeps its end; the database says, not the row). One UPDATE of what
    changed, and ``row`` shows what it wrote (the ORM's flush of the same row costs
    several times as much: a streamed call's first output passes here)."""
    values: dict[str, Any] = {}
    if row.first_output_at is None:
        first_ms = (now - row.accepted_at) * 1000
        values["first_output_at"] = now
        values["timings_json"] = json.dumps(
            {**json.loads(row.timings_json), "first_output": first_ms}
        )
        if metrics is not None:
            metrics.first_output_s.labels(row.function, str(row.cold).lower()).observe(
                max(0.0, now - row.accepted_at)
            )
    running = row.status in BEFORE_RUNNING
    if not values and not running:
        return
    params = {f"new_{k}": v for k, v in values.items()}
    stmt = _output_noted(tuple(values), running)
    status = session.connection().execute(stmt, {"call_id": row.id, **params}).scalar()
    if status is not None:
        values["status"] = status
    note_written(row, values)


@functools.cache
def _output_noted(columns: tuple[str, ...], running: bool) -> Update:
    """``UPDATE calls SET`` ``columns`` (from parameters ``new_<column>``) of call
    ``call_id``; with ``running``, its status ``running`` if it was waiting (queued or
    dispatched), else as it was; returning its status. Built once per shape."""
    c = CALLS.c
    values: dict[str, Any] = {name: bindparam(f"new_{name}") for name in columns}
    if running:
        values["status"] = case((one_of(c.status, BEFORE_RUNNING), "running"), else_=c.status)
    return update(CALLS).where(c.id == bindparam("call_id")).values(**values).returning(c.status)


def _add_output(
    session: Session, metrics: Metrics | None, now: float, row: Call, out: Any, seq: int | None
) -> None:
    """Store one streamed chunk. With the worker's ``seq`` a repeat (a retried post)
    is dropped; without it (an older worker) the chunk goes after the last one."""
    where = (CallOutput.call_id == row.id, CallOutput.attempt == row.attempt)
    if seq is None:
        last = session.scalar(select(func.coalesce(func.max(CallOutput.seq), 0)).where(*where))
        seq = int(last or 0) + 1
    elif session.scalar(select(CallOutput.id).where(*where, CallOutput.seq == seq)) is not None:
        return
    # Two posts of one chunk at the same moment: the second fails on the unique key
    # and the worker's retry of it is dropped above.
    session.add(
        CallOutput(call_id=row.id, attempt=row.attempt, seq=seq, output_json=_canonical(out))
    )
    session.flush()  # the chunk now: a repeat posted at the same moment fails here
    _note_output(session, metrics, now, row)


def cancel(session: Session, metrics: Metrics | None, now: float, call_id: str) -> CallView:
    """Cancel unless already final (then a no-op); the final state is returned."""
    get_row(session, call_id)
    finalize(session, metrics, now, call_id, "cancelled", error="cancelled by the client")
    row = get_row(session, call_id)
    session.refresh(row)
    return view(row)
