"""Waking waiters when a call changes: in-process, behind a small interface.

A waiter never relies on a wake-up alone: it re-reads the database after
every wake or after ``poll_interval_s``, so a change made by another
control-plane process is still seen within one poll interval. The processes
of one ``thaw server --processes N`` wake each other (``PeerNotifier``);
separate servers behind a load balancer see each other's changes by polling.
"""

from __future__ import annotations

import abc
import threading

from control_plane.peers import Datagrams, Peers


class Notifier(abc.ABC):
    @abc.abstractmethod
    def notify(self, call_id: str) -> None:
        """Something about ``call_id`` changed (status, output)."""

    @abc.abstractmethod
    def wait(self, call_id: str, seen: int, timeout_s: float) -> int:
        """Block until the change counter of ``call_id`` passes ``seen`` or the timeout.

        Returns the current counter; pass it back as ``seen`` next time.
        """

    def close(self) -> None:  # noqa: B027 (a notifier may run nothing)
        """Stop what the notifier runs (at the server's shutdown)."""


class InProcessNotifier(Notifier):
    """One lock; a condition per call that has waiters, so a change wakes only the
    threads waiting for that call (not every waiter of every call).

    Counters are kept for the ``max_calls`` calls changed last (and for every
    call with a waiter): a caller that waits for a call changed longer ago than
    that falls back to polling.
    """

    MAX_CALLS = 100_000

    def __init__(self, max_calls: int = MAX_CALLS) -> None:
        self._lock = threading.Lock()
        self._max_calls = max_calls
        self._counters: dict[str, int] = {}  # oldest first
        self._conds: dict[str, tuple[threading.Condition, int]] = {}  # call -> (cond, waiters)

    def notify(self, call_id: str) -> None:
        with self._lock:
            self._counters[call_id] = self._counters.pop(call_id, 0) + 1  # now the newest
            entry = self._conds.get(call_id)
            if entry is not None:
                entry[0].notify_all()
            if len(self._counters) > self._max_calls:
                self._trim()

    def _trim(self) -> None:
        """Forget the older half of the counters, but those of calls with waiters."""
        drop = len(self._counters) - self._max_calls // 2
        for call_id in [c for c, _ in zip(self._counters, range(drop), strict=False)]:
            if call_id not in self._conds:
                del self._counters[call_id]

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


class PeerNotifier(InProcessNotifier):
    """Wakes this process's waiters and those of its peers (``control_plane.peers``):
    each change is also sent, as a datagram with the call id, to every peer.

    A datagram that cannot be sent (the peer ended, its buffer is full) is
    dropped: that peer's waiters see the change at their next poll.
    """

    def __init__(self, peers: Peers, max_calls: int = InProcessNotifier.MAX_CALLS) -> None:
        super().__init__(max_calls)
        # What a peer sends is not sent on: every peer got it already.
        self._wake = Datagrams(peers, "wake", super().notify)

    def notify(self, call_id: str) -> None:
        super().notify(call_id)
        self._wake.send(call_id)

    def close(self) -> None:
        self._wake.close()
