"""Dispatcher over Celery: one ``send_task`` per message, to the worker's own queue."""

from __future__ import annotations

from celery import Celery
from pydantic import BaseModel

from control_plane.dispatch.base import Dispatcher, encode
from control_plane.protocol import (
    TASK_RUN_CALL,
    TASK_START_REPLICA,
    TASK_STOP_REPLICA,
    RunCall,
    StartReplica,
    StopReplica,
    worker_queue,
)


class CeleryDispatcher(Dispatcher):
    def __init__(self, app: Celery) -> None:
        self.app = app

    def _send(self, task: str, worker_id: str, msg: BaseModel) -> None:
        queue = worker_queue(worker_id)
        self.app.send_task(task, args=[encode(msg)], queue=queue, routing_key=queue)

    def start_replica(self, worker_id: str, msg: StartReplica) -> None:
        self._send(TASK_START_REPLICA, worker_id, msg)

    def stop_replica(self, worker_id: str, msg: StopReplica) -> None:
        self._send(TASK_STOP_REPLICA, worker_id, msg)

    def run_call(self, worker_id: str, msg: RunCall) -> None:
        self._send(TASK_RUN_CALL, worker_id, msg)

    def close(self) -> None:
        self.app.close()
