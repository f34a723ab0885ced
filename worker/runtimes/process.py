"""The process runtime: one OS process per replica, spoken to over a socket.

``ProcessRuntime.start`` takes a generic process from the pool, sends it
``specialize`` and waits for ``ready``. ``ProcessReplica`` owns the socket:
one reader thread routes each frame from the child to the queue of the call
it belongs to; callers wait on their own queue with their own deadline.

A replica is in one of three states::

    running ──▶ stopping ──▶ dead     (stop: shutdown, then kill after the grace)
        └───────────────────▶ dead     (the process exited, or was killed)

When it reaches ``dead`` every outstanding call is woken with a failure,
and, unless ``stop`` was the cause, ``on_exit`` is called once.
"""

from __future__ import annotations

import queue
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import IO, Any

from worker.child_protocol import (
    FROM_CHILD,
    CallEnd,
    CallError,
    CallMsg,
    Output,
    Ready,
    ReplicaSpec,
    Result,
    SetupFailed,
    Shutdown,
    Specialize,
    dump,
)
from worker.frames import FrameError
from worker.pool import GenericProcess, ProcessPool, SpawnError
from worker.runtimes.base import (
    CallRequest,
    CallUpdate,
    OnExit,
    ReplicaHandle,
    ReplicaStartError,
    Runtime,
)

_DEAD = object()  # queue sentinel: the replica is gone
GENERIC_PHASES = ("process_start", "imports", "device_init")


class ProcessRuntime(Runtime):
    def __init__(self, pool: ProcessPool | None = None, *, log: IO[bytes] | None = None) -> None:
        self.pool = pool or ProcessPool(log=log)

    def start(self, spec: ReplicaSpec, on_exit: OnExit) -> ProcessReplica:
        t0 = time.perf_counter()
        try:
            generic, warm = self.pool.acquire(spec.device)
        except SpawnError as exc:
            raise ReplicaStartError(str(exc)) from None
        phases = {"pool_acquire": (time.perf_counter() - t0) * 1000 if warm else 0.0}
        for name in GENERIC_PHASES:
            phases[name] = 0.0 if warm else generic.phases_ms.get(name, 0.0)
        replica = ProcessReplica(spec.replica_id, generic, on_exit)
        try:
            replica.specialize(spec, phases)
            self.pool.note_start(spec.device, replica.loads, replica.imports)
        finally:
            if warm:  # refilled once this start no longer needs the CPU
                self.pool.refill_later(spec.device)
        return replica

    def prewarm_device(self, device: str) -> None:
        self.pool.start_zygote()
        self.pool.prewarm(device)

    def pool_counts(self) -> tuple[int, int] | None:
        return self.pool.size(), self.pool.busy()

    def close(self) -> None:
        self.pool.close()


class ProcessReplica(ReplicaHandle):
    def __init__(self, replica_id: str, process: GenericProcess, on_exit: OnExit) -> None:
        self.replica_id = replica_id
        self.process = process
        self.phases_ms: dict[str, float] = {}
        self.imports: list[str] = []  # library modules its start imported
        self._on_exit = on_exit
        self._lock = threading.Lock()
        # A call's inbox: a SimpleQueue, made per call at a fraction of a Queue's cost.
        self._calls: dict[str, queue.SimpleQueue[object]] = {}
        self._control: queue.Queue[object] = queue.Queue()
        self._state = "running"
        self._death_reason = ""
        self._reader = threading.Thread(target=self._read_loop, daemon=True)
        self._reader.start()

    # --- start -------------------------------------------------------------
    def specialize(self, spec: ReplicaSpec, phases_ms: dict[str, float]) -> None:
        """Send ``specialize`` and wait for the answer; raise ``ReplicaStartError``."""
        self.phases_ms = dict(phases_ms)
        try:
            self.process.conn.send(dump(Specialize(spec=spec)))
        except OSError as exc:
            self._fail_start(f"could not reach the replica process: {exc}")
        msg = self._control.get()
        if isinstance(msg, Ready):
            _merge(self.phases_ms, msg.phases_ms)
            self.loads = list(msg.loads)
            self.imports = list(msg.imports)
            return
        if isinstance(msg, SetupFailed):
            _merge(self.phases_ms, msg.phases_ms)
            self._fail_start(msg.error)
        self._fail_start(f"the replica process exited during start: {self._death_reason}")

    def _fail_start(self, error: str) -> None:
        with self._lock:
            self._state = "stopping"  # a failed start is not an unexpected exit
        self.process.kill()
        raise ReplicaStartError(error, self.phases_ms)

    # --- calls -------------------------------------------------------------
    def call(self, request: CallRequest) -> Iterator[CallUpdate]:
        inbox: queue.SimpleQueue[object] = queue.SimpleQueue()
        with self._lock:
            if self._state != "running":
                yield CallUpdate("failed", error=f"replica {self.replica_id} is not running")
                return
            self._calls[request.call_id] = inbox
        try:
            yield from self._exchange(request, inbox)
        finally:
            with self._lock:
                self._calls.pop(request.call_id, None)

    def _exchange(
        self, request: CallRequest, inbox: queue.SimpleQueue[object]
    ) -> Iterator[CallUpdate]:
        msg = CallMsg(
            call_id=request.call_id,
            attempt=request.attempt,
            input=request.input,
            adapter=request.adapter,
            stream=request.stream,
        )
        try:
            self.process.conn.send(dump(msg))
        except (OSError, FrameError) as exc:
            yield CallUpdate("failed", error=f"could not send the call to the replica: {exc}")
            return
        deadline = time.monotonic() + request.timeout_s
        while True:
            try:
                item = inbox.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                reason = (
                    f"call {request.call_id} ran past its {request.timeout_s:g} s timeout; "
                    f"replica {self.replica_id} was killed"
                )
                # Killed once the timeout is reported: killed first, the replica's death
                # could reach the control plane before it and end this call as failed.
                try:
                    yield CallUpdate("timeout", error=reason)
                finally:
                    self.kill(reason)
                return
            update = _to_update(item, self._death_reason)
            yield update
            if update.final:
                return

    # --- life --------------------------------------------------------------
    @property
    def alive(self) -> bool:
        with self._lock:
            return self._state == "running"

    @property
    def outstanding_calls(self) -> int:
        with self._lock:
            return len(self._calls)

    def stop(self, grace_s: float = 5.0) -> None:
        with self._lock:
            if self._state == "dead":
                return
            self._state = "stopping"
        try:
            self.process.conn.send(dump(Shutdown()))
            self.process.proc.wait(timeout=grace_s)
        except (OSError, FrameError):
            pass  # already gone
        except subprocess.TimeoutExpired:
            pass  # it did not exit in time: killed below
        self.process.kill()
        self._reader.join(timeout=grace_s)

    def kill(self, reason: str) -> None:
        with self._lock:
            if self._state == "running":
                self._death_reason = reason
        self.process.kill()

    # --- reader --------------------------------------------------------------
    def _read_loop(self) -> None:
        while True:
            try:
                msg = FROM_CHILD.validate_python(self.process.conn.recv())
            except (FrameError, OSError, ValueError):
                break
            if isinstance(msg, Output | Result | CallError):
                with self._lock:
                    inbox = self._calls.get(msg.call_id)
                if inbox is not None:
                    inbox.put(msg)  # a call that already timed out is dropped
            else:
                self._control.put(msg)
        self._on_dead()

    def _on_dead(self) -> None:
        code = self.process.proc.wait()
        self.process.conn.close()
        with self._lock:
            unexpected = self._state == "running"
            self._state = "dead"
            if not self._death_reason:
                self._death_reason = f"the replica process exited with code {code}"
            inboxes = list(self._calls.values())
        for inbox in inboxes:
            inbox.put(_DEAD)
        self._control.put(_DEAD)
        if unexpected:
            self._on_exit(self.replica_id, self._death_reason)


def _to_update(item: object, death_reason: str) -> CallUpdate:
    if isinstance(item, Output):
        return CallUpdate("output", output=item.chunk)
    if isinstance(item, Result | CallError):
        # CallUpdate has CallEnd's fields but the call id (the caller knows it).
        fields = (f for f in CallEnd.model_fields if f != "call_id")
        ended: dict[str, Any] = {f: getattr(item, f) for f in fields}
        if isinstance(item, Result):
            return CallUpdate("succeeded", output=item.output, **ended)
        return CallUpdate("failed", error=item.error, **ended)
    return CallUpdate("failed", error=f"the replica died during the call: {death_reason}")


def _merge(into: dict[str, float], phases_ms: dict[str, float]) -> None:
    for name, ms in phases_ms.items():
        into[name] = into.get(name, 0.0) + ms
