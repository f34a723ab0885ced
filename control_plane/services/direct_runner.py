"""Running dispatched calls over workers' direct ports, and recording their events.

Two kinds of call take this path (``control_plane.dispatch.direct``):

- a warm synchronous call, claimed as it is accepted
  (``services.direct_calls``), run by the request's own thread;
- a warm streamed call (an LLM's), claimed as it is accepted and run by a thread
  of its own (``start_or_queue``) while its caller reads the outputs, handed to
  it in memory (``services.live_outputs``) and recorded with the call's end. Its
  events are read by the one thread that reads every stream (``DirectChannel.stream``),
  which hands the outputs over; the call's thread wakes for its start, its first
  output and its end;
- a call that waited for a replica and was just routed to it by the
  reconciler, run by a thread of its own (``start``), so the first call after
  a cold start does not wait for a broker hop and HTTP event posts.

A call whose worker has no direct port, or whose port cannot be reached, goes
through the worker's queue (and back to the call queue if that fails too). A
call whose message cannot be encoded ends failed (``end_unsendable``). A
call that was sent but whose end did not come back on the connection is left
to the worker's HTTP report or to lost-worker handling (the caller waits on
the database).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from control_plane.db.models import Call
from control_plane.dispatch.base import UnsendableError
from control_plane.dispatch.direct import DirectLostError, DirectUnavailableError
from control_plane.errors import ConflictError
from control_plane.protocol import FINAL_CALL_EVENTS, CallEvent, RunCall
from control_plane.services import batching, calls, dispatching
from control_plane.services.call_spans import call_spans
from control_plane.services.calls import CallView
from control_plane.services.combining import Combiner
from control_plane.services.context import Services
from control_plane.services.direct_calls import Claim
from control_plane.services.live_outputs import LiveCall, LiveItem

log = logging.getLogger(__name__)

# Background runs (routed calls) at once; beyond this a routed call takes the queue.
MAX_BACKGROUND_RUNS = 64
# Call records (starts, first outputs, ends) made in one transaction at most.
MAX_RECORDS_AT_ONCE = 32
# How long past its deadline a live stream's end is waited for on its connection
# (the worker ends the call at its own deadline, a little later than the control
# plane's); after it, the worker's report over HTTP.
DEADLINE_GRACE_S = 5.0


class DirectRunner:
    def __init__(
        self,
        services: Services,
        kick: Callable[[str], None],
        send_queued: Callable[[str, RunCall], bool],
    ) -> None:
        self.s = services
        self._kick = kick  # reconcile a function (a slot freed, a call requeued)
        self._send_queued = send_queued  # through the worker's queue
        # Fast-path routing decisions and the recording of their ends take turns
        # in this process, so two callers do not both count the same free slot.
        self.lock = threading.Lock()
        self._background = KeptThreads("thaw-direct", MAX_BACKGROUND_RUNS)
        self._records = Combiner(self._record_batch, MAX_RECORDS_AT_ONCE)

    @property
    def enabled(self) -> bool:
        return self.s.direct is not None

    def start(self, claim: Claim) -> bool:
        """Run ``claim`` on a thread of its own; False (nothing done) when there is no
        direct port to run it on or too many run already: send it through the queue."""
        if not self._has_port(claim):
            return False
        return self._background.submit(lambda: self.run(claim, record_started=True))

    def start_or_queue(self, claim: Claim) -> None:
        """Run ``claim`` on a thread of its own, else send it through the worker's queue
        (and back to the call queue if that fails too); returns at once."""
        if self.start(claim):
            return
        self.s.live.end(claim.call_id)  # its reader reads the database
        if not self._send_queued(claim.worker_id, claim.message):
            self._requeue(claim)

    def run(self, claim: Claim, *, record_started: bool = False) -> CallView | None:
        """Send ``claim`` and record its events until the final one (blocking); the
        call as its final event left it, or None when this did not end it.
        ``record_started``: mark the call running when it starts (whoever polls it
        sees ``running``); a caller that waits for the end anyway need not."""
        if not self._has_port(claim):
            self.s.live.end(claim.call_id)
            if not self._send_queued(claim.worker_id, claim.message):
                self._requeue(claim)
            return None
        assert self.s.direct is not None and claim.data_addr and claim.data_token
        timeout_s = claim.deadline_at - self.s.clock()
        counter = self.s.metrics.direct_calls
        # Dispatched and running count alike as in flight: a caller that waits for the
        # end has the worker leave out the started event.
        message = claim.message
        if not record_started:
            message = message.model_copy(update={"report_started": False})
        live = self.s.live.get(claim.call_id)
        run = _Run()
        try:
            if live is not None:
                self._follow_live(claim, message, timeout_s, live, run, record_started)
            else:
                addr, token = claim.data_addr, claim.data_token
                for ev in self.s.direct.run(addr, token, message, timeout_s):
                    if ev.kind in FINAL_CALL_EVENTS:  # counted before its caller is woken
                        run.ended = True
                        counter.labels(claim.function, "ran").inc()
                    if ev.kind != "started" or record_started:
                        run.final = self._record(claim, [ev]) or run.final
        except UnsendableError as exc:
            return self.end_unsendable(claim.function, claim.message, exc, claim.row)
        except DirectUnavailableError as exc:
            log.warning(
                "direct port unavailable, sending call %s through the queue: %s", claim.call_id, exc
            )
            counter.labels(claim.function, "unavailable").inc()
            if not self._send_queued(claim.worker_id, claim.message):
                self._requeue(claim)
        except DirectLostError as exc:
            log.info("%s; waiting for the worker's report", exc)
            if not run.ended:
                counter.labels(claim.function, "lost").inc()
        finally:
            if run.kept or run.pending:  # the run stopped without its end: what it had is kept
                self._record(claim, [*run.pending, *joined(run.kept)])
            if live is not None:
                self.s.live.end(claim.call_id)
        return run.final

    def _follow_live(
        self,
        claim: Claim,
        message: RunCall,
        timeout_s: float,
        live: LiveCall,
        run: _Run,
        record_started: bool,
    ) -> None:
        """Run a call whose outputs a reader takes in memory. The channel's stream
        reader hands them over as they are read, on its own thread; this thread wakes
        for the rest: the start, the first output (recorded once the reader passed it
        on, with the time it came) and the end."""
        assert self.s.direct is not None and claim.data_addr and claim.data_token
        inbox: queue.SimpleQueue[tuple[CallEvent | DirectLostError, float, bool]]
        inbox = queue.SimpleQueue()
        lock = threading.Lock()  # run.kept and run.handed, between the reader and this thread

        def on_event(ev: CallEvent) -> None:  # on the stream reader's thread: never blocks
            arrived = self.s.clock()
            handed = _handed(live, ev)
            if handed:
                _put_outputs(live, ev)  # to the reader first, then to the record
                with lock:
                    if run.handed:
                        run.kept.append(ev)
                        return
                    run.handed = True
            inbox.put((ev, arrived, handed))

        def on_lost(exc: DirectLostError) -> None:
            inbox.put((exc, 0.0, False))

        stream = self.s.direct.stream(claim.data_addr, claim.data_token, message, on_event, on_lost)
        until = time.monotonic() + max(0.0, timeout_s) + DEADLINE_GRACE_S
        abandoned = False
        while True:
            try:
                wait_s = None if abandoned else max(0.0, until - time.monotonic())
                item, arrived, handed = inbox.get(timeout=wait_s)
            except queue.Empty:
                stream.abandon()  # its end (final or lost) still comes through the inbox
                abandoned = True
                continue
            if isinstance(item, DirectLostError):
                raise item
            ev = item
            if ev.kind in FINAL_CALL_EVENTS:  # counted before its caller is woken
                run.ended = True
                self.s.metrics.direct_calls.labels(claim.function, "ran").inc()
            if handed:  # the first output: recorded once its reader passed it on
                live.wait_shown()  # (``live_outputs``), with the time it came
                self._record(claim, [*run.pending, ev], at=arrived)
                run.pending.clear()
            elif ev.kind == "started" and live.wanted:
                if record_started:
                    run.pending.append(ev)
            elif ev.kind != "started" or record_started:
                with lock:
                    kept, run.kept = run.kept, []
                run.final = self._record(claim, [*run.pending, *joined(kept), ev]) or run.final
                run.pending.clear()
                if ev.kind in FINAL_CALL_EVENTS:
                    live.put(LiveItem("final", data=run.final))  # the call as it ended
                    stream.ack()
                    return

    def end_unsendable(
        self, function: str, msg: RunCall, exc: UnsendableError, row: Call | None = None
    ) -> CallView | None:
        """End a dispatched call whose message cannot be encoded: failed, not retried
        (it would fail alike), its slot freed; the first end stands if it ended
        meanwhile. The call as it ended, or None. ``row``: as in ``Claim``."""
        log.warning("call %s cannot be sent: %s", msg.call_id, exc)
        error = f"the call's message could not be encoded, so it never ran: {exc}"
        ev = CallEvent(attempt=msg.attempt, kind="failed", error=error)
        return self._record_events(function, msg.call_id, [ev], row)

    def trace_final(self, call_id: str, view: CallView | None = None) -> None:
        """Emit the spans of a call that ended, when tracing is on (``view``: the call
        as its caller already read it)."""
        if not self.s.tracing.enabled:
            return
        if view is None:
            with self.s.db.session() as session:
                view = calls.get(session, call_id)
        self.s.tracing.emit(call_spans(view))

    def _has_port(self, claim: Claim) -> bool:
        return self.s.direct is not None and bool(claim.data_addr and claim.data_token)

    def _record(
        self, claim: Claim, events: list[CallEvent], at: float | None = None
    ) -> CallView | None:
        return self._record_events(claim.function, claim.call_id, events, claim.row, at)

    def _record_events(
        self,
        function: str,
        call_id: str,
        events: list[CallEvent],
        row: Call | None,
        at: float | None = None,
    ) -> CallView | None:
        """Record events in order, in one transaction; the call as it ended when one
        ended it. ``at``: when the events came (else as each is recorded). Records
        made at the same time by other calls' threads share the transaction and the
        turn under the lock (``_record_batch``)."""
        recorded = self._records.submit(_Record(function, call_id, events, row, at))
        if recorded is None:
            return None  # ended meanwhile (cancelled, deadline): the first end stands
        self.s.notifier.notify(call_id)
        if recorded.kick:
            self._kick(function)
        if recorded.view is not None:  # these events ended it
            self.trace_final(call_id, recorded.view)
        return recorded.view

    def _record_batch(self, items: Sequence[_Record]) -> list[_Recorded | BaseException | None]:
        """Records that came together, in one transaction under the lock (a burst of
        streams starts, sends its first outputs and ends together: one commit and one
        turn instead of one each). Should the transaction fail, it is rolled back and
        each record is made again alone, so one call's failure is its own."""
        try:
            with self.lock, self.s.db.session() as session:
                return [self._record_in(session, item) for item in items]
        except Exception:
            if len(items) == 1:
                raise
            log.warning("a batch of %d call records failed; each is recorded alone", len(items))
        done: list[_Recorded | BaseException | None] = []
        for item in items:
            try:
                with self.lock, self.s.db.session() as session:
                    done.append(self._record_in(session, item))
            except Exception as e:
                done.append(e)
        return done

    def _record_in(self, session: Session, item: _Record) -> _Recorded | None:
        """``item``'s events in ``session``; None when the call had ended already (the
        events before the one refused stay, as recorded)."""
        if item.row is not None:
            session.add(item.row)  # as dispatched, detached since: no read, no copy
        kick = False
        try:
            for ev in item.events:
                now = self.s.clock() if item.at is None else item.at
                kick = calls.record_event(session, self.s.metrics, now, item.call_id, ev) or kick
                batching.observe(self.s.metrics, item.function, ev)
        except ConflictError:
            return None
        final = any(ev.kind in FINAL_CALL_EVENTS for ev in item.events)
        return _Recorded(calls.get(session, item.call_id) if final else None, kick)

    def _requeue(self, claim: Claim) -> None:
        with self.s.db.session() as session:
            dispatching.requeue(session, claim.call_id)
        self._kick(claim.function)


class KeptThreads:
    """Daemon threads that run jobs, at most ``limit`` at once, each kept for the next
    job once idle: a job starts without a thread's start, which waits for the new
    thread to get the GIL (milliseconds when a burst of calls keeps it busy). Daemon,
    unlike a ``ThreadPoolExecutor``'s, so a stream still running does not hold up the
    process's exit."""

    def __init__(self, name: str, limit: int) -> None:
        self.name = name
        self.limit = limit
        self._jobs: queue.SimpleQueue[Callable[[], object]] = queue.SimpleQueue()
        self._mu = threading.Lock()
        self._busy = 0  # jobs taken and not yet done
        self._idle = 0  # threads waiting for a job, none promised one

    @property
    def busy(self) -> int:
        """Jobs taken and not yet done."""
        return self._busy

    def submit(self, job: Callable[[], object]) -> bool:
        """Run ``job`` on a kept thread (a new one when none is idle); False, with
        nothing done, when ``limit`` jobs run already."""
        with self._mu:
            if self._busy >= self.limit:
                return False
            self._busy += 1
            spawn = self._idle == 0
            if not spawn:
                self._idle -= 1  # that thread is promised this job
        self._jobs.put(job)
        if spawn:
            threading.Thread(target=self._serve, name=self.name, daemon=True).start()
        return True

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                job()
            except Exception:
                log.exception("a job on %s failed", self.name)
            finally:
                with self._mu:
                    self._busy -= 1
                    self._idle += 1


@dataclass
class _Record:
    """Events of one call to record, as ``DirectRunner._record_events`` takes them."""

    function: str
    call_id: str
    events: list[CallEvent]
    row: Call | None
    at: float | None


@dataclass
class _Recorded:
    view: CallView | None  # the call as it ended, when these events ended it
    kick: bool  # a slot was freed or the call requeued: reconcile the function


@dataclass
class _Run:
    """What a direct run has seen so far."""

    ended: bool = False  # its final event came
    final: CallView | None = None  # the call as its final event left it
    pending: list[CallEvent] = field(default_factory=list)  # a start, recorded with what follows
    handed: bool = False  # an output went to the reader in memory
    kept: list[CallEvent] = field(default_factory=list)  # outputs after that, to record


def _handed(live: LiveCall, ev: CallEvent) -> bool:
    """Whether ``ev``'s outputs go to the reader in memory (recorded later)."""
    return ev.kind == "output" and ev.seq is not None and live.wanted


def _put_outputs(live: LiveCall, ev: CallEvent) -> None:
    assert ev.seq is not None
    for n, chunk in enumerate(ev.chunks()):
        live.put(LiveItem("output", ev.seq + n, chunk))


def joined(outputs: list[CallEvent]) -> list[CallEvent]:
    """Output events with consecutive places as one event each (one insert)."""
    runs: list[tuple[CallEvent, list[Any]]] = []  # a run's first event, all its chunks
    for ev in outputs:
        if runs:
            head, chunks = runs[-1]
            if (
                head.seq is not None
                and ev.seq is not None
                and ev.attempt == head.attempt
                and head.seq + len(chunks) == ev.seq
            ):
                chunks.extend(ev.chunks())
                continue
        runs.append((ev, list(ev.chunks())))
    return [
        head if len(chunks) == len(head.chunks()) else head.model_copy(update={"outputs": chunks})
        for head, chunks in runs
    ]
