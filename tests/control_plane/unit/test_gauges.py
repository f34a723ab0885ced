"""Gauges refreshed from the database (``metrics.set_series``): a scrape taken while a
refresh runs never misses a series that stays."""

from __future__ import annotations

import threading

from control_plane.metrics import Metrics, set_series


def test_set_series_sets_in_place_and_removes_only_the_gone() -> None:
    m = Metrics()
    set_series(m.replicas, {("echo", "ready"): 2, ("echo", "starting"): 1})
    set_series(m.replicas, {("echo", "ready"): 3})
    text = m.exposition().decode()
    assert 'thaw_replicas{function="echo",state="ready"} 3.0' in text
    assert 'state="starting"' not in text


def test_a_scrape_during_refreshes_always_sees_the_live_series() -> None:
    m = Metrics()
    live = {("echo", "ready"): 1.0, ("other", "ready"): 2.0}
    set_series(m.replicas, live)
    stop = threading.Event()

    def refresh() -> None:  # as the reconcile loop does, all the time
        while not stop.is_set():
            set_series(m.replicas, live)

    refresher = threading.Thread(target=refresh)
    refresher.start()
    try:
        missing = [
            text
            for text in (m.exposition().decode() for _ in range(2000))
            if 'thaw_replicas{function="echo",state="ready"} 1.0' not in text
        ]
    finally:
        stop.set()
        refresher.join()
    assert missing == []
