"""Cancelling one call inside a replica without touching its other calls.

A call past its deadline is cancelled where it runs: the replica raises
:class:`CallCancelled` in the thread running that call's function (CPython's
``PyThreadState_SetAsyncExc``), and the replica and its other calls go on.
The exception arrives at the thread's next bytecode, so a function blocked in
native code (a long kernel, ``time.sleep``) stops when that returns; a
replica that stops answering altogether is the agent's to kill
(``worker.runtimes.process``).

``CallCancelled`` derives from ``BaseException``, as ``KeyboardInterrupt``
does, so a function's ``except Exception`` does not swallow it; its
``finally`` blocks run.

The contract that makes injection safe: an exception is raised in a thread
only while that thread runs the function of the call being cancelled
(between :meth:`RunningCalls.enter` and :meth:`RunningCalls.leave`), at most
once per call, and ``leave`` withdraws one that has not been delivered yet,
so it can never land in the next call the thread runs. ``leave`` may run
twice (once normally, once from the handler of a ``CallCancelled`` delivered
inside it); the second does nothing.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass

MAX_EARLY_CANCELS = 10_000


class CallCancelled(BaseException):
    """Raised in a call's thread when the call was cancelled (its deadline passed)."""


@dataclass
class _Running:
    thread_id: int
    raised: bool = False


class RunningCalls:
    """Which thread runs which call's function now; cancels by call id."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[str, _Running] = {}
        # Cancelled before their function started, oldest first; bounded, since a
        # cancel can also arrive just after its call ended.
        self._cancelled: dict[str, None] = {}

    def enter(self, call_id: str) -> bool:
        """The calling thread starts running ``call_id``'s function; False when the
        call was cancelled before it started (then do not run it)."""
        with self._lock:
            if self._cancelled.pop(call_id, False) is None:
                return False
            self._running[call_id] = _Running(threading.get_ident())
            return True

    def leave(self, call_id: str) -> None:
        """The function of ``call_id`` returned or raised; withdraw an undelivered cancel."""
        with self._lock:
            running = self._running.pop(call_id, None)
            if running is not None and running.raised:
                _set_async_exc(running.thread_id, None)

    def cancel(self, call_id: str) -> None:
        """Stop ``call_id``: raise in its thread if it is running, else keep it from starting."""
        with self._lock:
            running = self._running.get(call_id)
            if running is None:
                self._cancelled[call_id] = None
                if len(self._cancelled) > MAX_EARLY_CANCELS:
                    self._cancelled.pop(next(iter(self._cancelled)))
                return
            if not running.raised:
                running.raised = True
                _set_async_exc(running.thread_id, CallCancelled)


def _set_async_exc(thread_id: int, exc: type[BaseException] | None) -> None:
    # None withdraws a pending exception (the C API takes NULL for that).
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc is not None else None
    )
