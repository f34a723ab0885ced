"""The reconcile loop's pace, with one server process and with several."""

from __future__ import annotations

import time
from typing import Any

from control_plane.loop import BackgroundLoop


class CountingReconciler:
    def __init__(self) -> None:
        self.ticks = 0

    def tick(self) -> None:
        self.ticks += 1


def ticks_in(seconds: float, interval_s: float, processes: int) -> int:
    reconciler = CountingReconciler()
    loop = BackgroundLoop(reconciler, interval_s, processes)  # type: ignore[arg-type]
    loop.start()
    time.sleep(seconds)
    loop.stop()
    return reconciler.ticks


def test_one_process_ticks_every_interval() -> None:
    assert 5 <= ticks_in(0.5, 0.02, 1) <= 25


def test_each_of_n_processes_ticks_every_n_intervals() -> None:
    # Ten processes at 20 ms each tick every 200 ms: together, one tick per 20 ms.
    assert 1 <= ticks_in(0.5, 0.02, 10) <= 3


def test_processes_started_together_do_not_tick_together() -> None:
    loops: list[Any] = [BackgroundLoop(CountingReconciler(), 1.0, 8) for _ in range(8)]  # type: ignore[arg-type]
    first_waits = [loop._first_wait_s for loop in loops]
    assert all(0 <= w <= 8.0 for w in first_waits)
    assert len(set(first_waits)) == 8
