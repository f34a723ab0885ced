"""Holding a caller until its call ends, or its deadline passes.

A synchronous or streaming request waits here while the call is queued
(perhaps for a replica that is still starting) and while it runs. Waiting is
wake-ups from the notifier plus a re-read of the database at least every
``result_poll_interval_s`` (another control-plane process may have recorded
the result). When the deadline passes first, the call is ended as
``expired`` (still queued) or ``timeout`` (guarded: if a result won the race,
the result is returned) and ``DeadlineExceededError`` carries the cold-start phases seen so far.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Generator, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import anyio
import anyio.to_thread
from sqlalchemy.orm import Session

from control_plane.db.models import Replica, Worker
from control_plane.dispatch.direct import DirectLostError, DirectUnavailableError
from control_plane.errors import DeadlineExceededError, NotFoundError
from control_plane.services import calls, functions, replicas
from control_plane.services.calls import CallView
from control_plane.services.context import Services
from control_plane.services.live_outputs import LiveCall, LiveItem
from control_plane.services.states import DEADLINE_CALL_STATES

# A stream reading a direct run's hand-off waits this long past the call's deadline
# for the run's end (the run's own connection times out at the deadline).
LIVE_DEADLINE_GRACE_S = 5.0


@dataclass(frozen=True)
class StreamItem:
    kind: Literal["output", "done", "error", "waiting"]
    data: Any
    call: CallView | None = None


class Activator:
    def __init__(self, services: Services) -> None:
        self.s = services

    def _read(self, call_id: str) -> CallView:
        with self.s.db.session() as session:
            return calls.get(session, call_id)

    def _wait(self, call_id: str, seen: int, deadline_at: float) -> int:
        remaining_s = deadline_at - self.s.clock()
        timeout_s = max(0.0, min(self.s.settings.result_poll_interval_s, remaining_s))
        return self.s.notifier.wait(call_id, seen, timeout_s)

    def wait_final(self, call_id: str, known: CallView | None = None) -> CallView:
        """The call once final. Raises ``DeadlineExceededError`` at its deadline.
        ``known``: the call as its caller just read it (a final one is not read again)."""
        seen = 0
        while True:
            view = known if known is not None else self._read(call_id)
            known = None
            if view.status in DEADLINE_CALL_STATES:
                # Ended by the reconcile loop's expiry or the worker: same answer.
                raise self._deadline_error(view)
            if view.final:
                return view
            if self.s.clock() >= view.deadline_at:
                return self._expire(view)
            seen = self._wait(call_id, seen, view.deadline_at)

    def client_gone(self, call_id: str) -> None:
        """A streaming client went away: cancel its call unless it is final or the
        function's ``on_disconnect`` is ``finish``."""
        with self.s.db.session() as session:
            view = calls.get(session, call_id)
            try:
                policy = functions.active(session, view.function).spec.on_disconnect
            except NotFoundError:
                return  # deleted: its calls were cancelled with it
            if view.final or policy != "cancel":
                return
            error = 'the streaming client disconnected (on_disconnect = "cancel")'
            ended = calls.finalize(
                session, self.s.metrics, self.s.clock(), call_id, "cancelled", error=error
            )
            port = worker_port(session, view.replica_id) if ended is not None else None
        self.s.notifier.notify(call_id)
        if port is not None and self.s.direct is not None:
            # At once over the worker's direct port (an LLM frees the sequence and its
            # KV blocks now), not at its next heartbeat; the heartbeat says so too.
            with contextlib.suppress(DirectUnavailableError, DirectLostError):
                self.s.direct.cancel(*port, call_id)

    def stream(
        self, call_id: str, keepalive_s: float | None = None, deadline_at: float | None = None
    ) -> Iterator[StreamItem]:
        """Each streamed output in order, then ``done`` (the call) or ``error``.
        With ``keepalive_s``: a ``waiting`` item (its data the call's status) whenever
        that long passed with nothing else to give, e.g. through a cold start. A call
        run by this process over a direct port hands its outputs here in memory
        (``services.live_outputs``); the database is read for its end, or from where
        the hand-off stopped. ``deadline_at``: the call's, when the caller knows it."""
        last_seq = 0
        live = self.s.live.attach(call_id)
        if live is not None:
            try:
                last_seq, ended = yield from self._stream_live(
                    call_id, live, keepalive_s, deadline_at
                )
            finally:
                live.leave()
            if ended:
                return
        yield from self._stream_recorded(call_id, last_seq, keepalive_s)

    async def astream(
        self, call_id: str, keepalive_s: float | None = None, deadline_at: float | None = None
    ) -> AsyncGenerator[list[StreamItem]]:
        """``stream`` for the event loop, in batches: what the hand-off holds when the
        reader wakes, together (one wake-up, one write, however many tokens piled
        up), with no thread; the database part (a call not run over a direct port,
        or the rest after a fallback) on worker threads, an item a batch."""
        last_seq = 0
        live = self.s.live.attach(call_id)
        if live is not None:
            try:
                if deadline_at is None:
                    deadline_at = (await anyio.to_thread.run_sync(self._read, call_id)).deadline_at
                state = _LiveState(deadline_at, keepalive_s, self.s.clock())
                async for batch in self._astream_live(call_id, live, state):
                    yield batch
            finally:
                live.leave()
            if state.ended:
                return
            last_seq = state.last_seq
        recorded = self._stream_recorded(call_id, last_seq, keepalive_s)
        async for item in _in_threads(recorded):
            yield [item]

    async def _astream_live(
        self, call_id: str, live: LiveCall, state: _LiveState
    ) -> AsyncIterator[list[StreamItem]]:
        """``_stream_live`` in the event loop, in batches; where it stopped is ``state``."""
        while state.open(self.s.clock()):
            items = await live.get_ready(state.wait_s(self.s.clock()))
            batch, end = state.take(items, self.s.clock())
            if end is not None and end.kind == "final":
                view = end.data
                if not isinstance(view, CallView):
                    view = await anyio.to_thread.run_sync(self._read, call_id)
                batch += state.finish(view)
            if batch:
                yield batch  # resumed: the batch went out (the reader wants the next)
                live.shown()
            if end is not None:
                return

    def _stream_recorded(
        self, call_id: str, last_seq: int, keepalive_s: float | None
    ) -> Iterator[StreamItem]:
        """The call's recorded outputs after ``last_seq`` as they come, then its end."""
        seen = 0
        last_item = self.s.clock()
        while True:
            with self.s.db.session() as session:
                view = calls.get(session, call_id)
                chunks = calls.outputs_after(session, call_id, view.attempt, last_seq)
            for seq, out in chunks:
                last_seq = seq
                last_item = self.s.clock()
                yield StreamItem("output", out)
            if view.final:
                yield end_item(view)
                return
            if self.s.clock() >= view.deadline_at:
                try:
                    view = self._expire(view)
                except DeadlineExceededError as exc:
                    yield StreamItem("error", str(exc), self._read(call_id))
                    return
                continue
            if keepalive_s is not None and self.s.clock() - last_item >= keepalive_s:
                last_item = self.s.clock()
                yield StreamItem("waiting", view.status)
            until = view.deadline_at
            if keepalive_s is not None:
                until = min(until, last_item + keepalive_s)
            seen = self._wait(call_id, seen, until)

    def _stream_live(
        self, call_id: str, live: LiveCall, keepalive_s: float | None, deadline_at: float | None
    ) -> Generator[StreamItem, None, tuple[int, bool]]:
        """Outputs from the hand-off until the run's end: (the last seq given, whether
        the call's end was given too). Past the deadline (the run's connection times
        out then) or at a fallback, the database takes over."""
        if deadline_at is None:
            deadline_at = self._read(call_id).deadline_at
        state = _LiveState(deadline_at, keepalive_s, self.s.clock())
        while state.open(self.s.clock()):
            item = live.get(state.wait_s(self.s.clock()))
            outputs, end = state.take([] if item is None else [item], self.s.clock())
            yield from outputs
            if outputs:
                live.shown()
            if end is not None:
                if end.kind == "final":
                    view = end.data if isinstance(end.data, CallView) else self._read(call_id)
                    yield from state.finish(view)
                break
        return state.last_seq, state.ended

    def _expire(self, view: CallView) -> CallView:
        """End ``view`` as expired (still queued) or timeout and raise; if a result won
        the race, return it."""
        with self.s.db.session() as session:
            won = calls.end_at_deadline(session, self.s.metrics, self.s.clock(), view.id)
        self.s.notifier.notify(view.id)
        latest = self._read(view.id)
        if won or latest.status in DEADLINE_CALL_STATES:
            raise self._deadline_error(latest)
        return latest

    def _deadline_error(self, view: CallView) -> DeadlineExceededError:
        with self.s.db.session() as session:
            phases = self._phases_so_far(session, view)
        message = (
            f"call {view.id} did not finish within its deadline "
            f"({view.deadline_at - view.accepted_at:.3f} s); see the phases for where time went"
        )
        why = self.s.placement_errors.get(view.function)
        if view.replica_id is None and why:
            message += f"; no replica could be started: {why}"
        return DeadlineExceededError(message, view.id, phases)

    def _phases_so_far(self, session: Session, view: CallView) -> dict[str, float]:
        if view.phases_ms:
            return view.phases_ms
        # Still queued: the newest replica being started for it has the phases.
        live = replicas.live(session, view.function)
        starting = [r for r in live if r.state in ("pending", "starting")]
        return json.loads(starting[-1].phases_json) if starting else {}


def wait_dispatched(activator: Activator, call_id: str) -> CallView:
    """The call once it left the queue (so cold/warm is known), or once final.

    Raises ``DeadlineExceededError`` when the deadline passes while queued.
    """
    seen = 0
    while True:
        view = activator._read(call_id)
        if view.status in DEADLINE_CALL_STATES:
            raise activator._deadline_error(view)
        if view.final or view.status != "queued":
            return view
        if activator.s.clock() >= view.deadline_at:
            return activator._expire(view)
        seen = activator._wait(call_id, seen, view.deadline_at)


@dataclass
class _LiveState:
    """A reader of a run's hand-off: where it is, and when it stops waiting (the
    deadline and its grace) or sends a keepalive."""

    deadline_at: float
    keepalive_s: float | None
    last_item: float  # when the reader last gave something
    last_seq: int = 0
    ended: bool = False  # the call's end was given

    def open(self, now: float) -> bool:
        return now < self.deadline_at + LIVE_DEADLINE_GRACE_S

    def wait_s(self, now: float) -> float:
        wait_s = self.deadline_at + LIVE_DEADLINE_GRACE_S - now
        if self.keepalive_s is not None:
            wait_s = min(wait_s, self.last_item + self.keepalive_s - now)
        return wait_s

    def take(self, items: list[LiveItem], now: float) -> tuple[list[StreamItem], LiveItem | None]:
        """The outputs among ``items`` not given yet (none came: a keepalive when one is
        due), and the item that ended the hand-off (final or fallback), if one did."""
        if not items:
            if self.keepalive_s is not None and now - self.last_item >= self.keepalive_s:
                self.last_item = now
                return [StreamItem("waiting", "running")], None
            return [], None
        self.last_item = now
        outputs: list[StreamItem] = []
        for item in items:
            if item.kind != "output":
                return outputs, item
            if item.seq > self.last_seq:
                self.last_seq = item.seq
                outputs.append(StreamItem("output", item.data))
        return outputs, None

    def finish(self, view: CallView) -> list[StreamItem]:
        """The call's end, if the final item's call has ended."""
        if not view.final:
            return []
        self.ended = True
        return [end_item(view)]


_DONE = object()


async def _in_threads(items: Iterator[StreamItem]) -> AsyncIterator[StreamItem]:
    """``items``, each ``next`` on a worker thread (it blocks on the database)."""
    while True:
        item = await anyio.to_thread.run_sync(next, items, _DONE)
        if not isinstance(item, StreamItem):  # _DONE
            return
        yield item


def end_item(view: CallView) -> StreamItem:
    """A final call as its stream's last item: ``done`` with its output, or ``error``."""
    if view.status == "succeeded":
        return StreamItem("done", view.output, view)
    return StreamItem("error", view.error, view)


def worker_port(session: Session, replica_id: str | None) -> tuple[str, str] | None:
    """The direct port (address, token) of the worker running ``replica_id``; None
    when it has none (or the call never reached a replica)."""
    if replica_id is None:
        return None
    replica = session.get(Replica, replica_id)
    worker = session.get(Worker, replica.worker_id) if replica and replica.worker_id else None
    if worker is None or not worker.data_addr or not worker.data_token:
        return None
    return worker.data_addr, worker.data_token
