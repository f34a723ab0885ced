"""Streamed outputs handed from a direct run to its reader in this process, in memory.

A warm stream (an LLM's, ``Invocations.invoke(background=True)``) is run by a
thread of this process (``services.direct_runner``) while the request that made
it reads its outputs (``Activator.stream``). Through the database each output is
a write under the recording lock, a commit, a wake-up and a read: at a few
hundred tokens a second across streams that is the control plane's CPU. So the
run hands each chunk to the reader here instead::

    runner                                    reader
      open(id)  before the run starts           attach(id) → LiveCall, or None: read
      first output: put; once shown, recorded    the database as before
      later outputs: put, kept to record        get() → output (seq, chunk); shown()
      final: the kept outputs and the end         final: read the call's end
        recorded in one transaction, then put     fallback: read the database from
      end(id): fallback, unless final was put       the last seq it gave

Nothing is only in memory once the run is over: the first output is recorded as
soon as the reader has passed it on (``shown``, or ``FIRST_SHOWN_WAIT_S`` at most),
with the time it arrived (the call's first-output time stays exact); the rest with
the final event or, if the run stops without one (connection lost, port gone), when
it stops. Until then another reader of the same call (``GET /v1/calls/{id}``) sees
the first output only.

Why the first record waits: it is a transaction, a few milliseconds of Python, and
the reader needs the interpreter for as long to write the first token to its
client. Recorded first, the record's time is added to every stream's TTFT.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
from dataclasses import dataclass
from typing import Any, Literal

# How long a run waits for its reader to pass the first output on before it records
# it anyway (a reader slower than this is not waiting for the record: it is busy).
FIRST_SHOWN_WAIT_S = 0.05

LiveKind = Literal["output", "final", "fallback"]


@dataclass(frozen=True)
class LiveItem:
    kind: LiveKind
    seq: int = 0  # an output's place among the call's outputs
    data: Any = None


class LiveCall:
    """One call's hand-off: the runner puts, one reader gets (on a thread, ``get``, or
    in the event loop, ``get_ready``: no thread and one wake-up for what piled up)."""

    def __init__(self) -> None:
        self._items: collections.deque[LiveItem] = collections.deque()
        self._cond = threading.Condition()
        self._waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None = None
        self._ended = False
        self._shown = threading.Event()  # the reader passed an output on, or left
        self.attached = False
        self.reader_gone = False  # the reader left: put nothing more

    @property
    def wanted(self) -> bool:
        """Whether outputs should come this way (a reader may still read them)."""
        return not self.reader_gone

    def leave(self) -> None:
        """The reader's side: it reads no more (from here or at all)."""
        self.reader_gone = True
        self._shown.set()

    def shown(self) -> None:
        """The reader's side: the outputs it took are on their way to its client."""
        if not self._shown.is_set():  # once: a reader says it after every batch
            self._shown.set()

    def wait_shown(self) -> bool:
        """The runner's side: wait until the reader passed an output on or left
        (``FIRST_SHOWN_WAIT_S`` at most)."""
        return self._shown.wait(FIRST_SHOWN_WAIT_S)

    def put(self, item: LiveItem) -> None:
        with self._cond:
            if item.kind != "output":
                self._ended = True
            self._items.append(item)
            self._cond.notify()
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            loop, future = waiter
            with contextlib.suppress(RuntimeError):  # its loop closed: the reader is gone
                loop.call_soon_threadsafe(_wake, future)

    def finish(self) -> None:
        """The run is over: a fallback for a reader still waiting, unless it ended."""
        if not self._ended:
            self.put(LiveItem("fallback"))

    def get(self, timeout_s: float) -> LiveItem | None:
        """The next item, or None when ``timeout_s`` passed with none."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._items, max(0.0, timeout_s)):
                return None
            return self._items.popleft()

    async def get_ready(self, timeout_s: float) -> list[LiveItem]:
        """Every item there is, waiting up to ``timeout_s`` for one (none: ``[]``)."""
        with self._cond:
            if self._items or timeout_s <= 0:
                return self._take_all()
            loop = asyncio.get_running_loop()
            future = loop.create_future()
            self._waiter = (loop, future)
        # Timed out, the future is set as a wake-up sets it: a timer, 4 µs a wait here
        # where anyio's cancel scope took 16, for every batch of every stream.
        timer = loop.call_later(timeout_s, _wake, future)
        try:
            await future
        finally:
            timer.cancel()
            with self._cond:
                if self._waiter is not None and self._waiter[1] is future:
                    self._waiter = None
        with self._cond:
            return self._take_all()

    def _take_all(self) -> list[LiveItem]:
        items = list(self._items)
        self._items.clear()
        return items


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class LiveOutputs:
    def __init__(self) -> None:
        self._calls: dict[str, LiveCall] = {}
        self._lock = threading.Lock()

    def open(self, call_id: str) -> LiveCall:
        """The runner's side, before its run starts."""
        live = LiveCall()
        with self._lock:
            self._calls[call_id] = live
        return live

    def get(self, call_id: str) -> LiveCall | None:
        with self._lock:
            return self._calls.get(call_id)

    def attach(self, call_id: str) -> LiveCall | None:
        """The reader's side: the call's hand-off while its run goes on, else None."""
        with self._lock:
            live = self._calls.get(call_id)
            if live is None or live.attached:
                return None  # one reader takes the hand-off; others read the database
            live.attached = True
            return live

    def end(self, call_id: str) -> None:
        """The run is over (every output recorded): a reader still waiting for a final
        item reads the database from where it is."""
        with self._lock:
            live = self._calls.pop(call_id, None)
        if live is not None:
            live.finish()

    def __len__(self) -> int:
        with self._lock:
            return len(self._calls)
