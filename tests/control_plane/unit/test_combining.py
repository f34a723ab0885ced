"""Flat combining (``services.combining``): callers at the same time are served in
batches, each gets its own item's outcome, and the lead passes on."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import pytest

from control_plane.services.combining import Combiner

WAIT_S = 10.0


class Doubler:
    """Doubles each item; a negative one is that item's error. The first batch waits
    for ``gate``, so callers that come meanwhile pile up behind it."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.gate = threading.Event()
        self.entered = threading.Event()
        self._mu = threading.Lock()

    def __call__(self, items: Sequence[int]) -> list[int | BaseException]:
        with self._mu:
            first = not self.batches
            self.batches.append(list(items))
        if first:
            self.entered.set()
            assert self.gate.wait(WAIT_S)
        return [ValueError(f"negative {i}") if i < 0 else 2 * i for i in items]


def _burst(combiner: Combiner[int, int], items: list[int]) -> dict[int, object]:
    got: dict[int, object] = {}
    mu = threading.Lock()

    def call(i: int) -> None:
        try:
            out: object = combiner.submit(i)
        except Exception as e:
            out = e
        with mu:
            got[i] = out

    threads = [threading.Thread(target=call, args=(i,)) for i in items]
    for t in threads:
        t.start()
    return got if _joined(threads) else pytest.fail("a caller never got its outcome")


def _joined(threads: list[threading.Thread]) -> bool:
    for t in threads:
        t.join(WAIT_S)
    return not any(t.is_alive() for t in threads)


def _until(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_one_caller_alone_runs_its_own_batch_of_one() -> None:
    run = Doubler()
    run.gate.set()
    combiner = Combiner(run, limit=8)
    assert combiner.submit(21) == 42
    assert combiner.submit(5) == 10
    assert run.batches == [[21], [5]]


def test_callers_that_come_during_a_batch_are_served_together_each_with_its_own_outcome() -> None:
    run = Doubler()
    combiner = Combiner(run, limit=8)
    first: dict[str, object] = {}
    leader = threading.Thread(target=lambda: first.setdefault("out", combiner.submit(1)))
    leader.start()
    assert run.entered.wait(WAIT_S)  # the first caller leads, its batch held open

    items = [2, -3, 4, 5, -6, 7]
    others: dict[int, object] = {}
    waiting = threading.Thread(target=lambda: others.update(_burst(combiner, items)))
    waiting.start()
    _until(lambda: combiner.waiting == len(items))  # all queued behind the first batch
    run.gate.set()
    assert _joined([leader, waiting])

    assert first["out"] == 2
    assert {i: o for i, o in others.items() if not isinstance(o, Exception)} == {
        2: 4,
        4: 8,
        5: 10,
        7: 14,
    }
    assert str(others[-3]) == "negative -3" and str(others[-6]) == "negative -6"
    assert run.batches[0] == [1]
    assert sorted(run.batches[1]) == sorted(items)  # the rest in one batch, not six


def test_a_batch_holds_at_most_the_limit() -> None:
    run = Doubler()
    combiner = Combiner(run, limit=3)
    leader = threading.Thread(target=combiner.submit, args=(0,))
    leader.start()
    assert run.entered.wait(WAIT_S)
    got: dict[int, object] = {}
    burst = threading.Thread(target=lambda: got.update(_burst(combiner, list(range(1, 11)))))
    burst.start()
    _until(lambda: combiner.waiting == 10)
    run.gate.set()
    assert _joined([leader, burst])
    assert got == {i: 2 * i for i in range(1, 11)}
    assert max(len(b) for b in run.batches) == 3
    assert sorted(i for b in run.batches for i in b) == list(range(11))  # each item once


def test_many_callers_at_once_each_get_their_own_result() -> None:
    run = Doubler()
    run.gate.set()
    combiner = Combiner(run, limit=4)
    got = _burst(combiner, list(range(200)))
    assert got == {i: 2 * i for i in range(200)}
    assert sorted(i for b in run.batches for i in b) == list(range(200))
    assert combiner.waiting == 0


def test_a_failing_batch_fails_each_of_its_items_and_the_next_one_still_runs() -> None:
    calls = 0

    def run(items: Sequence[int]) -> list[int | BaseException]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("the batch's own failure")
        return [i + 1 for i in items]

    combiner = Combiner(run, limit=4)
    with pytest.raises(RuntimeError, match="the batch's own failure"):
        combiner.submit(1)
    assert combiner.submit(1) == 2


def test_a_batch_that_returns_the_wrong_number_of_outcomes_fails_its_items() -> None:
    combiner: Combiner[int, int] = Combiner(lambda items: [], limit=4)
    with pytest.raises(RuntimeError, match="0 outcomes for a batch of 1"):
        combiner.submit(1)


def test_a_limit_under_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one item"):
        Combiner(lambda items: list(items), limit=0)
