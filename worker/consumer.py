"""The worker's Celery consumer: its own queue, JSON only, thread pool.

This is the only worker module that imports Celery. The app comes from the
same factory the control plane sends with (``make_celery``: JSON only, late
acks, reject on worker lost, prefetch 1). Each task validates its payload
into a protocol model (refusing unknown protocol versions) and hands it to
a handler that blocks until the work is done, so a message is acknowledged
only after its call has ended.

The consumer runs Celery's ``WorkController`` on a thread of its own, with
no signal handlers: the agent owns signals and shutdown.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from control_plane.dispatch.celery_app import make_celery
from control_plane.protocol import (
    TASK_RUN_CALL,
    TASK_START_REPLICA,
    TASK_STOP_REPLICA,
    RunCall,
    StartReplica,
    StopReplica,
    worker_queue,
)

log = logging.getLogger(__name__)
RESTART_FIRST_DELAY_S = 1.0
RESTART_MAX_DELAY_S = 10.0


@dataclass(frozen=True)
class Handlers:
    start_replica: Callable[[StartReplica], None]
    stop_replica: Callable[[StopReplica], None]
    run_call: Callable[[RunCall], None]


@dataclass(frozen=True)
class BrokerConfig:
    url: str
    folder: Path | None = None  # for filesystem://
    poll_interval_s: float = 0.05


class Consumer:
    """Consumes ``thaw.worker.<worker_id>`` with ``concurrency`` threads."""

    def __init__(
        self, broker: BrokerConfig, worker_id: str, handlers: Handlers, concurrency: int
    ) -> None:
        self.queue = worker_queue(worker_id)
        self.app = make_celery(broker.url, broker.folder, broker.poll_interval_s)
        self._register(handlers)
        self._hostname = f"thaw-{worker_id}@{socket.gethostname()}"
        self._concurrency = concurrency
        self._controller = self._new_controller()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="thaw-consumer", daemon=True)
        self.error: BaseException | None = None

    def _new_controller(self) -> Any:
        return self.app.WorkController(
            hostname=self._hostname,
            queues=[self.queue],
            pool_cls="threads",
            concurrency=self._concurrency,
            without_heartbeat=True,
            without_mingle=True,
            without_gossip=True,
            loglevel="WARNING",
        )

    def _register(self, handlers: Handlers) -> None:
        def task(name: str, model: Any, handler: Callable[[Any], None]) -> None:
            def run(payload: dict[str, Any]) -> None:
                try:
                    msg = model.model_validate(payload)
                except ValidationError:
                    # An unknown protocol version lands here too (its validator raises
                    # ProtocolVersionError). Acked: redelivering it cannot help.
                    log.exception("refused a malformed %s message", name)
                    return
                handler(msg)

            self.app.task(name=name, shared=False, acks_late=True, reject_on_worker_lost=True)(run)

        task(TASK_START_REPLICA, StartReplica, handlers.start_replica)
        task(TASK_STOP_REPLICA, StopReplica, handlers.stop_replica)
        task(TASK_RUN_CALL, RunCall, handlers.run_call)

    def _run(self) -> None:
        """Run Celery's worker until ``stop``. When it stops by itself (the broker went
        away and kombu gave up reconnecting), start a fresh one after a pause that
        doubles up to ``RESTART_MAX_DELAY_S``: the worker reconnects on its own."""
        delay_s = RESTART_FIRST_DELAY_S
        while True:
            try:
                self._controller.start()
            except BaseException as exc:  # SystemExit from Celery's own shutdown included
                self.error = exc
            if self._stopping.wait(delay_s):
                return
            log.warning("the Celery consumer stopped (%r); starting it again", self.error)
            delay_s = min(delay_s * 2, RESTART_MAX_DELAY_S)
            self._controller = self._new_controller()

    def start(self) -> None:
        # Celery's thread pool finds tasks through the process's default app.
        self.app.set_default()
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop taking messages; wait for running tasks up to ``timeout_s``."""
        self._stopping.set()
        self._controller.stop(in_sighandler=False)
        self._thread.join(timeout=timeout_s)
        self.app.close()
