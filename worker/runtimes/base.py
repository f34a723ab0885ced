"""The runtime interface: how the agent starts, calls and stops replicas.

A runtime turns a ``ReplicaSpec`` into a running replica (a process, a
container) and hands back a ``ReplicaHandle``. The agent never learns how
the replica runs; a Docker runtime implements the same two classes.

Guarantees every implementation keeps:

- ``Runtime.start`` returns only a ready replica (``setup`` done), or raises
  ``ReplicaStartError`` with the error and the phases measured so far; a
  failed start leaves nothing running.
- ``ReplicaHandle.call`` yields zero or more ``output`` updates, then
  exactly one final update (``succeeded``, ``failed`` or ``timeout``), and
  never raises for anything the function or its process did. A request with a
  ``relay`` may have its streamed chunks handed to it as they arrive, on the
  runtime's own thread, instead of yielded (``Relay``): the call's thread then
  wakes only for its end. A runtime without a way to do so ignores the relay.
- A call past its deadline ends as ``timeout`` and is cancelled in the
  replica; the replica and its other calls go on. A replica is killed only
  when it stops answering; its calls then end ``failed`` with ``fault``
  ``"replica"`` (``not_run`` for those it never started).
- When a replica dies other than through ``stop``, ``on_exit(replica_id,
  reason)`` is called once, from a runtime thread.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from control_plane.protocol import EngineStats, TokenUsage
from worker.child_protocol import LoadStats, ReplicaSpec

# "cancelled" is decided by the agent; a runtime never yields it.
UpdateKind = Literal["output", "succeeded", "failed", "timeout", "cancelled"]

OnExit = Callable[[str, str], None]
# Takes a call's streamed chunks as they arrive (in order, several at once where
# they came together) and answers how many of them, from the first, it reported;
# fewer than all: the call yields the rest, and every later chunk, itself.
Relay = Callable[[list[Any]], int]
# Whose failure a failed call or start is (``protocol.CallEvent.fault``).
Fault = Literal["function", "replica"]


class ReplicaStartError(Exception):
    """A replica could not be started; ``phases_ms`` holds what was measured.
    ``fault`` "function": the function's own start failed (its code, ``setup`` or
    artifacts), which any replica of it would repeat; "replica": this replica's
    process did (it could not be spawned, or died), which says something about
    the worker."""

    def __init__(
        self, message: str, phases_ms: dict[str, float] | None = None, fault: Fault = "replica"
    ) -> None:
        super().__init__(message)
        self.phases_ms = phases_ms or {}
        self.fault: Fault = fault


@dataclass(frozen=True)
class CallRequest:
    call_id: str
    input: Any = None
    adapter: str | None = None
    attempt: int = 1
    timeout_s: float = 300.0
    stream: bool = False
    relay: Relay | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class CallUpdate:
    kind: UpdateKind
    output: Any = None
    # several streamed chunks at once (made while the last update was being reported)
    outputs: list[Any] | None = None
    error: str | None = None
    timings_ms: dict[str, float] = field(default_factory=dict)
    adapter_hit: bool | None = None  # whether the call's adapter was loaded already
    loaded_adapters: list[str] | None = None  # what the replica holds after the call
    batch_size: int | None = None  # batched functions: calls in this call's batch
    batch_index: int | None = None  # and its place in the batch
    usage: TokenUsage | None = None  # an LLM call's tokens, as its function counted them
    token_gaps_ms: list[float] | None = None  # and the gaps between them, ms
    fault: Fault | None = None  # failed: the function's doing, or its replica's
    not_run: bool = False  # failed before the replica started it

    @property
    def final(self) -> bool:
        return self.kind != "output"

    def chunks(self) -> list[Any]:
        """An output update's chunks in order: ``outputs``, else ``output`` alone."""
        return list(self.outputs) if self.outputs is not None else [self.output]


class ReplicaHandle(abc.ABC):
    """One running replica."""

    replica_id: str
    phases_ms: dict[str, float]
    loads: Sequence[LoadStats] = ()  # the start's weight loads, where the runtime knows them

    @abc.abstractmethod
    def call(self, request: CallRequest) -> Iterator[CallUpdate]:
        """Run one call; see the module docstring for what is yielded."""

    @abc.abstractmethod
    def stop(self, grace_s: float = 5.0) -> None:
        """Stop the replica: ask it to exit, kill it after ``grace_s``. Idempotent."""

    @abc.abstractmethod
    def kill(self, reason: str) -> None:
        """Kill the replica now; outstanding calls end as failed with ``reason``."""

    def cancel(self, call_id: str) -> None:
        """Stop one running call (its ``call`` then ends); default: nothing, the call
        runs to its end."""
        return None

    @property
    @abc.abstractmethod
    def alive(self) -> bool: ...

    @property
    @abc.abstractmethod
    def outstanding_calls(self) -> int: ...

    @property
    def engine_stats(self) -> EngineStats | None:
        """An LLM replica's engine load as it last reported it; None: not one."""
        return None


class Runtime(abc.ABC):
    """Starts replicas of one kind (processes, containers)."""

    @abc.abstractmethod
    def start(self, spec: ReplicaSpec, on_exit: OnExit) -> ReplicaHandle:
        """Start and specialize a replica; block until it is ready."""

    def prewarm_device(self, device: str) -> None:
        """Get ready to start replicas on ``device`` fast (blocking); default: nothing."""
        return None

    def pool_counts(self) -> tuple[int, int] | None:
        """(warm processes waiting, processes handed out and alive), or None: no pool."""
        return None

    @abc.abstractmethod
    def close(self) -> None:
        """Release what the runtime holds (warm processes); replicas are stopped by the agent."""
