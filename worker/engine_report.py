"""An LLM replica's engine load, sent to its agent as it changes (the child's side).

A function with ``engine_stats()`` (``worker.llm.function.LLMFunction``) gets one
reporter thread: every ``poll_s`` it reads the stats and sends an ``engine`` message
(``child_protocol.EngineReport``) when they changed, and at least every
``resend_s``. The agent keeps the last one per replica and puts it in its
heartbeat (``ReplicaReport.llm``); the control plane exports it as gauges.
Reading the engine from this thread races its generation thread: a read that
meets a table being changed is skipped, and the next tick reads again. A read that
raises ``sdk.ReplicaLost`` (the engine cannot run again) goes to ``on_lost``, which
ends the replica at once rather than at its next call.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from control_plane.protocol import EngineStats
from worker.sdk import ReplicaLost

POLL_S = 0.05
RESEND_S = 1.0


class EngineReporter:
    def __init__(
        self,
        source: Callable[[], EngineStats | None],
        send: Callable[[dict[str, Any]], None],
        poll_s: float = POLL_S,
        resend_s: float = RESEND_S,
        clock: Callable[[], float] = time.monotonic,
        on_lost: Callable[[ReplicaLost], None] | None = None,
    ) -> None:
        self._source, self._send, self._on_lost = source, send, on_lost
        self._poll_s, self._resend_s, self._clock = poll_s, resend_s, clock
        self._last: EngineStats | None = None
        self._sent_at = float("-inf")
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="thaw-engine-report", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def tick(self) -> bool:
        """Read the stats once; send them if they changed or are due. Whether sent."""
        from worker.child_protocol import EngineReport, dump

        try:
            stats = self._source()
        except ReplicaLost:
            raise
        except RuntimeError:  # the engine changed a table under the read: next tick
            return False
        now = self._clock()
        if stats is None or (stats == self._last and now - self._sent_at < self._resend_s):
            return False
        self._send(dump(EngineReport(stats=stats)))
        self._last, self._sent_at = stats, now
        return True

    def _run(self) -> None:
        while not self._stopped.wait(self._poll_s):
            try:
                self.tick()
            except OSError:  # the agent is gone: so is this replica
                return
            except ReplicaLost as lost:
                if self._on_lost is not None:
                    self._on_lost(lost)
                return


def reporter_for(
    instance: Any,
    send: Callable[[dict[str, Any]], None],
    on_lost: Callable[[ReplicaLost], None] | None = None,
) -> EngineReporter | None:
    """A started reporter for ``instance`` if it has ``engine_stats``; else None."""
    source = getattr(instance, "engine_stats", None)
    if not callable(source):
        return None
    reporter = EngineReporter(source, send, on_lost=on_lost)
    reporter.start()
    return reporter
