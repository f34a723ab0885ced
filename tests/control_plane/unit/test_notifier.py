"""The in-process notifier: a change wakes the waiters of that call only."""

from __future__ import annotations

import threading

from control_plane.notifier import InProcessNotifier


def test_a_change_seen_before_waiting_returns_at_once() -> None:
    n = InProcessNotifier()
    n.notify("c1")
    assert n.wait("c1", seen=0, timeout_s=60) == 1


def test_notify_wakes_the_waiter_of_that_call_and_leaves_no_condition_behind() -> None:
    n = InProcessNotifier()
    got: list[int] = []
    waiting = threading.Thread(target=lambda: got.append(n.wait("c1", seen=0, timeout_s=60)))
    waiting.start()
    while "c1" not in n._conds:  # the waiter is registered
        threading.Event().wait(0.001)
    n.notify("c2")  # another call: c1's waiter keeps waiting
    assert got == []
    n.notify("c1")
    waiting.join(timeout=60)
    assert got == [1]
    assert n._conds == {}


def test_a_wait_that_times_out_returns_the_counter_it_saw() -> None:
    n = InProcessNotifier()
    n.notify("c2")
    assert n.wait("c1", seen=0, timeout_s=0.01) == 0
    assert n._conds == {}


def test_counters_of_older_calls_are_dropped_but_not_those_with_a_waiter() -> None:
    n = InProcessNotifier(max_calls=4)
    got: list[int] = []
    n.notify("waited")
    waiting = threading.Thread(target=lambda: got.append(n.wait("waited", seen=1, timeout_s=60)))
    waiting.start()
    while "waited" not in n._conds:
        threading.Event().wait(0.001)
    for i in range(10):  # past the bound: the older half goes, more than once
        n.notify(f"c{i}")
    assert len(n._counters) <= 4
    assert n.wait("c0", seen=0, timeout_s=0.01) == 0  # forgotten: its waiter would poll
    assert n.wait("c9", seen=0, timeout_s=0.01) == 1  # the newest is kept
    n.notify("waited")  # its counter was kept: 2 > 1 wakes it
    waiting.join(timeout=60)
    assert got == [2]
