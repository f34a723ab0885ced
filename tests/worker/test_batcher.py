"""The batcher on its own: batches by key, up to the maximum, in arrival order."""

from __future__ import annotations

import queue

from worker.batcher import Batcher


def test_calls_with_different_keys_never_share_a_batch() -> None:
    batches: queue.Queue[list[str]] = queue.Queue()
    # A wait far longer than the test: only full batches are formed.
    b = Batcher(lambda items, waits: batches.put(items), 2, 600.0, key=lambda s: s[0])
    for item in ("a1", "b1", "a2", "b2"):
        b.submit(item)
    assert [batches.get(timeout=10), batches.get(timeout=10)] == [["a1", "a2"], ["b1", "b2"]]


def test_a_batch_is_cut_at_the_maximum_and_reports_each_wait() -> None:
    got: queue.Queue[tuple[list[int], list[float]]] = queue.Queue()
    b = Batcher(lambda items, waits: got.put((items, waits)), 3, 600.0)
    for i in range(6):
        b.submit(i)
    first, waits = got.get(timeout=10)
    second, _ = got.get(timeout=10)
    assert (first, second) == ([0, 1, 2], [3, 4, 5])
    assert len(waits) == 3 and all(w >= 0 for w in waits)


def test_a_lone_call_goes_once_the_wait_is_over() -> None:
    got: queue.Queue[tuple[list[str], list[float]]] = queue.Queue()
    b = Batcher(lambda items, waits: got.put((items, waits)), 8, 0.05)
    b.submit("x")
    items, waits = got.get(timeout=10)
    assert items == ["x"] and waits[0] >= 50
