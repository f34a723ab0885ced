"""The server's background loop: a thread that runs ``Reconciler.tick`` periodically.

Thin on purpose: every decision is in the services. An error in one tick is
logged and the next tick runs; the loop must outlive a database hiccup.

With ``thaw server --processes N`` every process runs a loop, and a tick
reconciles every function whichever process runs it. So each ticks every
N intervals, from a random start: together they tick as often as one
process does, where N loops at the full rate would do the same work N times.
"""

from __future__ import annotations

import logging
import random
import threading

from control_plane.services.reconciler import Reconciler

log = logging.getLogger(__name__)


class BackgroundLoop:
    def __init__(self, reconciler: Reconciler, interval_s: float, processes: int = 1) -> None:
        self.reconciler = reconciler
        self.interval_s = interval_s * processes  # this process's share of the ticks
        # Processes started together would tick together, then all wait.
        self._first_wait_s = random.uniform(0, self.interval_s) if processes > 1 else interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="thaw-reconcile", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        wait_s = self._first_wait_s
        while not self._stop.wait(wait_s):
            wait_s = self.interval_s
            try:
                self.reconciler.tick()
            except Exception:
                log.exception("reconcile tick failed; retrying next interval")
