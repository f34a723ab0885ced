"""Dynamic batching inside a replica: gather calls, hand them over as one batch.

A batched replica (``[batching]`` in the function's spec) does not run its
calls one by one on its pool of call threads. Calls are submitted here as
they arrive; one thread takes the oldest waiting call and gathers more behind
it::

    waiting ──▶ batch formed when  max_batch_size calls are waiting
                                or max_wait_ms has passed since the first arrived
            ──▶ run(batch)          one batch at a time; calls arriving meanwhile
                                    wait for the next one (and a late first call
                                    forms its batch at once)

Only calls with the same ``key`` (the adapter they name) share a batch; the
others wait, in order, for a batch of their own. ``run`` is given the items
and how long each waited, in milliseconds; it must not raise (a failure
belongs to the calls, which ``run`` answers itself).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Waiting(Generic[T]):
    item: T
    arrived_s: float


class Batcher(Generic[T]):
    """Forms batches of at most ``max_batch_size`` items within ``max_wait_s``."""

    def __init__(
        self,
        run: Callable[[list[T], list[float]], None],
        max_batch_size: int,
        max_wait_s: float,
        key: Callable[[T], Hashable] = lambda item: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, not {max_batch_size}")
        self._run = run
        self.max_batch_size = max_batch_size
        self.max_wait_s = max(0.0, max_wait_s)
        self._key = key
        self._clock = clock
        self._cond = threading.Condition()
        self._waiting: list[Waiting[T]] = []
        self._thread = threading.Thread(target=self._loop, name="thaw-batcher", daemon=True)
        self._thread.start()

    def submit(self, item: T) -> None:
        with self._cond:
            self._waiting.append(Waiting(item, self._clock()))
            self._cond.notify()

    def next_batch(self) -> tuple[list[T], list[float]]:
        """Block until a batch is formed; return its items and their waits in ms."""
        with self._cond:
            while not self._waiting:
                self._cond.wait()
            first = self._waiting[0]
            key = self._key(first.item)
            deadline_s = first.arrived_s + self.max_wait_s
            while True:
                same = [w for w in self._waiting if self._key(w.item) == key]
                left_s = deadline_s - self._clock()
                if len(same) >= self.max_batch_size or left_s <= 0:
                    break
                self._cond.wait(left_s)
            batch = same[: self.max_batch_size]
            taken = {id(w) for w in batch}
            self._waiting = [w for w in self._waiting if id(w) not in taken]
            now_s = self._clock()
        return [w.item for w in batch], [(now_s - w.arrived_s) * 1000 for w in batch]

    def _loop(self) -> None:
        while True:
            items, waits_ms = self.next_batch()
            self._run(items, waits_ms)
