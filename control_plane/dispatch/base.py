"""The interface services use to send protocol messages to one worker's queue."""

from __future__ import annotations

import abc
from typing import Any

from pydantic import BaseModel

from control_plane.protocol import RunCall, StartReplica, StopReplica


class UnsendableError(Exception):
    """A message that cannot be encoded (a call's input nested past what pydantic
    serializes): it was not sent, and sending it again cannot help. The caller ends
    the call failed rather than leaving it dispatched or queued."""


def encode(msg: BaseModel) -> dict[str, Any]:
    """``msg`` as JSON-ready data; raises ``UnsendableError``."""
    try:
        return msg.model_dump(mode="json")
    except ValueError as exc:  # pydantic's serialization errors among them
        raise UnsendableError(f"{type(msg).__name__} cannot be encoded: {exc}") from None


class Dispatcher(abc.ABC):
    """Delivers messages to ``protocol.worker_queue(worker_id)``.

    Sends are fire-and-forget: the worker answers over HTTP (events). A send
    that cannot reach the broker raises; the caller leaves the call queued. A
    message that cannot be encoded raises ``UnsendableError``.
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
