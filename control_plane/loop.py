"""The server's background loop: a thread that runs ``Reconciler.tick`` periodically.

Thin on purpose: every decision is in the services. An error in one tick is
logged and the next tick runs; the loop must outlive a database hiccup.
"""

from __future__ import annotations

import logging
import threading

from control_plane.services.reconciler import Reconciler

log = logging.getLogger(__name__)


class BackgroundLoop:
    def __init__(self, reconciler: Reconciler, interval_s: float) -> None:
        self.reconciler = reconciler
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="thaw-reconcile", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.reconciler.tick()
            except Exception:
                log.exception("reconcile tick failed; retrying next interval")
