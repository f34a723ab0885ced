"""Waking waiters when a call changes: in-process, behind a small interface.

A waiter never relies on a wake-up alone: it re-reads the database after
every wake or after ``poll_interval_s``, so a change made by another
control-plane process (which cannot notify this one) is still seen within
one poll interval. A Redis pub/sub notifier can replace this class without
touching the callers.
"""

from __future__ import annotations

import abc
import threading


class Notifier(abc.ABC):
    @abc.abstractmethod
    def notify(self, call_id: str) -> None:
        """Something about ``call_id`` changed (status, output)."""

    @abc.abstractmethod
    def wait(self, call_id: str, seen: int, timeout_s: float) -> int:
        """Block until the change counter of ``call_id`` passes ``seen`` or the timeout.

        Returns the current counter; pass it back as ``seen`` next time.
        """


class InProcessNotifier(Notifier):
    """One lock; a condition per call that has waiters, so a change wakes only the
    threads waiting for that call (not every waiter of every call)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[str, int] = {}
        self._conds: dict[str, tuple[threading.Condition, int]] = {}  # call -> (cond, waiters)

    def notify(self, call_id: str) -> None:
        with self._lock:
            self._counters[call_id] = self._counters.get(call_id, 0) + 1
            entry = self._conds.get(call_id)
            if entry is not None:
                entry[0].notify_all()

    def wait(self, call_id: str, seen: int, timeout_s: float) -> int:
        with self._lock:
            cond, waiters = self._conds.get(call_id) or (threading.Condition(self._lock), 0)
            self._conds[call_id] = (cond, waiters + 1)
            try:
                cond.wait_for(lambda: self._counters.get(call_id, 0) > seen, timeout=timeout_s)
                return self._counters.get(call_id, 0)
            finally:
                cond, waiters = self._conds[call_id]
                if waiters == 1:
                    del self._conds[call_id]
                else:
                    self._conds[call_id] = (cond, waiters - 1)

    def forget(self, call_id: str) -> None:
        with self._lock:
            self._counters.pop(call_id, None)
