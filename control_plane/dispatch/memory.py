"""An in-process Dispatcher: one thread-safe queue per worker, for tests and fakes.

Messages go through ``model_dump(mode="json")`` and back, as over Celery, so
a fake worker sees exactly what a real one would.
"""

from __future__ import annotations

import queue
import threading

from pydantic import BaseModel

from control_plane.dispatch.base import Dispatcher, encode
from control_plane.protocol import (
    TASK_RUN_CALL,
    TASK_START_REPLICA,
    TASK_STOP_REPLICA,
    RunCall,
    StartReplica,
    StopReplica,
)

Envelope = tuple[str, dict[str, object]]


class InMemoryDispatcher(Dispatcher):
    def __init__(self) -> None:
        self._queues: dict[str, queue.Queue[Envelope]] = {}
        self._lock = threading.Lock()

    def queue_for(self, worker_id: str) -> queue.Queue[Envelope]:
        with self._lock:
            return self._queues.setdefault(worker_id, queue.Queue())

    def _send(self, task: str, worker_id: str, msg: BaseModel) -> None:
        self.queue_for(worker_id).put((task, encode(msg)))

    def start_replica(self, worker_id: str, msg: StartReplica) -> None:
        self._send(TASK_START_REPLICA, worker_id, msg)

    def stop_replica(self, worker_id: str, msg: StopReplica) -> None:
        self._send(TASK_STOP_REPLICA, worker_id, msg)

    def run_call(self, worker_id: str, msg: RunCall) -> None:
        self._send(TASK_RUN_CALL, worker_id, msg)
