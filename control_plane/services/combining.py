"""Flat combining: work that must take turns, done for many callers at once.

Callers that arrive while one is being served do not each wait for a lock and then
pay for their own turn: they queue, and one of them (the leader) runs every queued
item (up to a limit) as one batch, in one turn, then hands the lead to the next one
still waiting. Where a turn has a fixed cost (a transaction's begin and commit, a lock
handed from thread to thread, each hand-off waiting for the interpreter lock), a
burst of callers pays it once per batch instead of once each.

Each caller gets its own item's outcome, its result or its exception: one item's
failure is not another's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Combiner(Generic[T, R]):
    """Runs ``run_batch`` over the items handed to ``submit`` by callers at the same
    time, at most ``limit`` at once, one batch at a time. ``run_batch`` returns, in
    order, each item's result or the exception that item's caller gets."""

    def __init__(
        self, run_batch: Callable[[Sequence[T]], Sequence[R | BaseException]], limit: int
    ) -> None:
        if limit < 1:
            raise ValueError(f"a batch holds at least one item, not {limit}")
        self._run_batch = run_batch
        self.limit = limit
        self._mu = threading.Lock()
        self._waiting: list[_Slot[T, R]] = []
        self._leading = False  # a caller runs a batch now, or is about to

    @property
    def waiting(self) -> int:
        """Items handed in and not yet taken into a batch."""
        with self._mu:
            return len(self._waiting)

    def submit(self, item: T) -> R:
        """``item``'s outcome, run in a batch with whatever else waits: its result,
        or its exception raised here."""
        slot: _Slot[T, R] = _Slot(item)
        with self._mu:
            self._waiting.append(slot)
            lead = not self._leading
            self._leading = True
        if not lead:
            slot.woken.wait()
            if not slot.leads:  # done by another caller's batch
                return slot.outcome()
        self._lead()
        return slot.outcome()

    def _lead(self) -> None:
        """Run one batch, the queue's head first (this caller's own item is there),
        then hand the lead to the first item still waiting, if any."""
        with self._mu:
            batch = self._waiting[: self.limit]
            del self._waiting[: self.limit]
        try:
            outcomes: Sequence[R | BaseException] = self._run_batch([s.item for s in batch])
            if len(outcomes) != len(batch):
                raise RuntimeError(f"{len(outcomes)} outcomes for a batch of {len(batch)}")
        except BaseException as e:  # the batch's own failure: every item's
            outcomes = [e] * len(batch)
        for slot, outcome in zip(batch, outcomes, strict=True):
            slot.set(outcome)
        with self._mu:
            following = self._waiting[0] if self._waiting else None
            if following is None:
                self._leading = False
            else:
                following.leads = True
        for slot in batch:
            slot.woken.set()
        if following is not None:
            following.woken.set()


class _Slot(Generic[T, R]):
    __slots__ = ("_done", "_error", "_result", "item", "leads", "woken")

    def __init__(self, item: T) -> None:
        self.item = item
        self.woken = threading.Event()
        self.leads = False  # woken to run the next batch, not with an outcome
        self._done = False
        self._result: R | None = None
        self._error: BaseException | None = None

    def set(self, outcome: R | BaseException) -> None:
        if isinstance(outcome, BaseException):
            self._error = outcome
        else:
            self._result = outcome
        self._done = True

    def outcome(self) -> R:
        if not self._done:
            raise RuntimeError("a combined item ended with no outcome")
        if self._error is not None:
            raise self._error
        return self._result  # type: ignore[return-value]
