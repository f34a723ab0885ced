"""The interface services use to send protocol messages to one worker's queue."""

from __future__ import annotations

import abc

from control_plane.protocol import RunCall, StartReplica, StopReplica


class Dispatcher(abc.ABC):
    """Delivers messages to ``protocol.worker_queue(worker_id)``.

    Sends are fire-and-forget: the worker answers over HTTP (events). A send
    that cannot reach the broker raises; the caller leaves the call queued.
    """

    @abc.abstractmethod
    def start_replica(self, worker_id: str, msg: StartReplica) -> None: ...

    @abc.abstractmethod
    def stop_replica(self, worker_id: str, msg: StopReplica) -> None: ...

    @abc.abstractmethod
    def run_call(self, worker_id: str, msg: RunCall) -> None: ...

    def close(self) -> None:
        """Release connections; the default holds none."""
        return None
