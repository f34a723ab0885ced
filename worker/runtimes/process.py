"""The process runtime: one OS process per replica, spoken to over a socket.

``ProcessRuntime.start`` takes a generic process from the pool, sends it
``specialize`` and waits for ``ready``. ``ProcessReplica`` owns the socket:
one reader thread routes each frame from the child to the queue of the call
it belongs to; callers wait on their own queue with their own deadline. A
call with a relay (``CallRequest.relay``) has its outputs handed to the relay
by the reader instead, the frames that came in one read grouped per call: a
step of an LLM's streams is reported without waking a thread per call.

A replica is in one of three states::

    running ──▶ stopping ──▶ dead     (stop: shutdown, then kill after the grace)
        └───────────────────▶ dead     (the process exited, or was killed)

When it reaches ``dead`` every outstanding call is woken with a failure,
and, unless ``stop`` was the cause, ``on_exit`` is called once.

A call's deadline ends that call only::

    sent ──(deadline)──▶ timeout reported ──▶ cancel + ping sent to the child
                                                 │ pong within answer_timeout_s: it serves on;
                                                 │   the call's slot is free once the child
                                                 │   says the call ended
                                                 └ no pong: killed (it stopped answering);
                                                   its other calls fail as the replica's fault

Calls beyond the function's target concurrency wait here for a slot, not in
the child, so a call the replica dies before it was sent is known never to
have started (``not_run``: the control plane runs it again without spending
a retry).
"""

from __future__ import annotations

import itertools
import logging
import queue
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import IO, Any, Literal

from control_plane.protocol import MAX_OUTPUTS_PER_EVENT, EngineStats
from worker.child_protocol import (
    FROM_CHILD,
    CallEnd,
    CallError,
    CallMsg,
    CancelCall,
    EngineReport,
    Output,
    Ping,
    Pong,
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
    Fault,
    OnExit,
    Relay,
    ReplicaHandle,
    ReplicaStartError,
    Runtime,
)

log = logging.getLogger(__name__)
_DEAD = object()  # queue sentinel: the replica is gone
GENERIC_PHASES = ("process_start", "imports", "device_init")
# How long a replica has to answer a ping (sent with every cancel) before it is
# taken for hung and killed (Settings: THAW_REPLICA_ANSWER_TIMEOUT_S).
ANSWER_TIMEOUT_S = 10.0


class ProcessRuntime(Runtime):
    def __init__(
        self,
        pool: ProcessPool | None = None,
        *,
        log: IO[bytes] | None = None,
        answer_timeout_s: float = ANSWER_TIMEOUT_S,
    ) -> None:
        self.pool = pool or ProcessPool(log=log)
        self.answer_timeout_s = answer_timeout_s

    def start(self, spec: ReplicaSpec, on_exit: OnExit) -> ProcessReplica:
        t0 = time.perf_counter()
        try:
            generic, warm = self.pool.acquire(spec.device)
        except SpawnError as exc:
            raise ReplicaStartError(str(exc)) from None
        phases = {"pool_acquire": (time.perf_counter() - t0) * 1000 if warm else 0.0}
        for name in GENERIC_PHASES:
            phases[name] = 0.0 if warm else generic.phases_ms.get(name, 0.0)
        replica = ProcessReplica(spec.replica_id, generic, on_exit, self.answer_timeout_s)
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
    def __init__(
        self,
        replica_id: str,
        process: GenericProcess,
        on_exit: OnExit,
        answer_timeout_s: float = ANSWER_TIMEOUT_S,
    ) -> None:
        self.replica_id = replica_id
        self.process = process
        self.phases_ms: dict[str, float] = {}
        self.imports: list[str] = []  # library modules its start imported
        self.answer_timeout_s = answer_timeout_s
        self._on_exit = on_exit
        self._lock = threading.Lock()
        # A call's inbox: a SimpleQueue, made per call at a fraction of a Queue's cost.
        self._calls: dict[str, queue.SimpleQueue[object]] = {}
        self._relays: dict[str, Relay] = {}  # call id -> where its outputs go first
        # Calls whose deadline passed, until the child says they ended: they keep
        # their slot meanwhile (their thread there may still run).
        self._cancelling: set[str] = set()
        self._slots: Slots | None = None  # the function's target concurrency, if any
        self._pings: dict[int, threading.Timer] = {}  # seq -> the kill if no pong comes
        self._ping_seq = itertools.count(1)
        self._control: queue.Queue[object] = queue.Queue()
        self._state = "running"
        self._death_reason = ""
        self._engine_stats: EngineStats | None = None  # an LLM replica's, as last reported
        self._reader = threading.Thread(target=self._read_loop, daemon=True)
        self._reader.start()

    # --- start -------------------------------------------------------------
    def specialize(self, spec: ReplicaSpec, phases_ms: dict[str, float]) -> None:
        """Send ``specialize`` and wait for the answer; raise ``ReplicaStartError``."""
        self.phases_ms = dict(phases_ms)
        if spec.max_concurrent_calls is not None and spec.max_batch_size is None:
            self._slots = Slots(spec.max_concurrent_calls)
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
            self._fail_start(msg.error, "function")
        self._fail_start(f"the replica process exited during start: {self._death_reason}")

    def _fail_start(self, error: str, fault: Fault = "replica") -> None:
        with self._lock:
            self._state = "stopping"  # a failed start is not an unexpected exit
        self.process.kill()
        raise ReplicaStartError(error, self.phases_ms, fault)

    # --- calls -------------------------------------------------------------
    def call(self, request: CallRequest) -> Iterator[CallUpdate]:
        deadline = time.monotonic() + request.timeout_s
        waited = self._slots.take(deadline) if self._slots is not None else "ok"
        if waited != "ok":
            yield self._never_sent(request, waited)
            return
        inbox: queue.SimpleQueue[object] = queue.SimpleQueue()
        with self._lock:
            if self._state != "running":
                self._release_slot()
                yield self._never_sent(request, "dead")
                return
            self._calls[request.call_id] = inbox
            if request.relay is not None:
                self._relays[request.call_id] = request.relay
        last: CallUpdate | None = None
        try:
            for last in self._exchange(request, inbox, deadline):
                yield last
        finally:
            # Past its deadline, or abandoned by the caller: the child may still run it.
            running = last is None or last.kind in ("output", "timeout")
            with self._lock:
                self._calls.pop(request.call_id, None)
                self._relays.pop(request.call_id, None)
                if running:  # its slot is freed when the child says it ended
                    self._cancelling.add(request.call_id)
            if running:
                self.cancel(request.call_id)
            else:
                self._release_slot()

    def _never_sent(self, request: CallRequest, why: Literal["timeout", "dead"]) -> CallUpdate:
        if why == "timeout":
            error = (
                f"call {request.call_id} waited its whole {request.timeout_s:g} s timeout "
                f"for a free slot on replica {self.replica_id}"
            )
            return CallUpdate("timeout", error=error)
        error = f"replica {self.replica_id} is not running: {self._death_reason or 'stopped'}"
        return CallUpdate("failed", error=error, fault="replica", not_run=True)

    def _exchange(
        self, request: CallRequest, inbox: queue.SimpleQueue[object], deadline: float
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
            error = f"could not send the call to the replica: {exc}"
            yield CallUpdate("failed", error=error, fault="replica", not_run=True)
            return
        while True:
            try:
                item = inbox.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                error = (
                    f"call {request.call_id} ran past its {request.timeout_s:g} s timeout "
                    f"and was cancelled; replica {self.replica_id} serves on"
                )
                # Cancelled (by ``call``) once the timeout is reported, so the child's
                # answer to the cancel cannot reach the control plane first.
                yield CallUpdate("timeout", error=error)
                return
            if isinstance(item, Output):
                chunks, after = _waiting_outputs(item, inbox)
                several = {"outputs": chunks} if len(chunks) > 1 else {"output": chunks[0]}
                yield CallUpdate("output", **several)
                if after is None:
                    continue
                item = after
            update = _to_update(item, self._death_reason)
            yield update
            if update.final:
                return

    def cancel(self, call_id: str) -> None:
        """Stop ``call_id`` in the child (``worker.call_cancel``); the replica and its other
        calls go on. It must still answer: no pong in ``answer_timeout_s`` kills it."""
        seq = next(self._ping_seq)
        reason = (
            f"replica {self.replica_id} stopped answering: no reply within "
            f"{self.answer_timeout_s:g} s after call {call_id} was cancelled"
        )
        timer = threading.Timer(self.answer_timeout_s, self._unanswered, (seq, reason))
        timer.daemon = True
        with self._lock:
            if self._state != "running":
                return
            self._pings[seq] = timer
        timer.start()
        try:
            self.process.conn.send(dump(CancelCall(call_id=call_id)))
            self.process.conn.send(dump(Ping(seq=seq)))
        except (OSError, FrameError):
            pass  # gone already: the reader sees it

    def _unanswered(self, seq: int, reason: str) -> None:
        with self._lock:
            if self._pings.pop(seq, None) is None:
                return  # answered just now
        self.kill(reason)

    def _release_slot(self) -> None:
        if self._slots is not None:
            self._slots.give()

    # --- life --------------------------------------------------------------
    @property
    def alive(self) -> bool:
        with self._lock:
            return self._state == "running"

    @property
    def outstanding_calls(self) -> int:
        with self._lock:
            return len(self._calls) + len(self._cancelling)

    @property
    def engine_stats(self) -> EngineStats | None:
        return self._engine_stats

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
        conn = self.process.conn
        relayed: dict[str, list[Output]] = {}  # outputs read together, per relayed call
        while True:
            try:
                msg = FROM_CHILD.validate_python(conn.recv())
            except (FrameError, OSError, ValueError):
                self._relay_all(relayed)  # what came before the end
                break
            if isinstance(msg, Output) and msg.call_id in self._relays:
                waiting = relayed.setdefault(msg.call_id, [])
                waiting.append(msg)
                if len(waiting) >= MAX_OUTPUTS_PER_EVENT:
                    self._relay(msg.call_id, relayed.pop(msg.call_id))
            elif isinstance(msg, Output | Result | CallError):
                if msg.call_id in relayed:  # its outputs before its end
                    self._relay(msg.call_id, relayed.pop(msg.call_id))
                self._route(msg)
            elif isinstance(msg, Pong):
                with self._lock:
                    timer = self._pings.pop(msg.seq, None)
                if timer is not None:
                    timer.cancel()
            elif isinstance(msg, EngineReport):
                self._engine_stats = msg.stats  # one reference, replaced whole
            else:
                self._control.put(msg)
            if relayed and not conn.buffered():  # all that came in this read is sorted
                self._relay_all(relayed)
        self._on_dead()

    def _relay_all(self, relayed: dict[str, list[Output]]) -> None:
        for call_id, outputs in relayed.items():
            self._relay(call_id, outputs)
        relayed.clear()

    def _relay(self, call_id: str, outputs: list[Output]) -> None:
        """Hand ``outputs`` to their call's relay; what it did not take, and every later
        output of the call, goes to the call's inbox."""
        with self._lock:
            relay = self._relays.get(call_id)
        taken = 0
        if relay is not None:
            try:
                taken = relay([output.chunk for output in outputs])
            except Exception:  # a bug there must not stop this replica's reader
                log.exception("the relay of call %s failed; its thread takes its outputs", call_id)
        if taken >= len(outputs):
            return
        with self._lock:
            self._relays.pop(call_id, None)
        for output in outputs[taken:]:
            self._route(output)

    def _route(self, msg: Output | Result | CallError) -> None:
        """To the call's inbox; the end of a cancelled call frees its slot instead."""
        with self._lock:
            inbox = self._calls.get(msg.call_id)
            freed = not isinstance(msg, Output) and msg.call_id in self._cancelling
            self._cancelling.discard(msg.call_id)
        if inbox is not None:
            inbox.put(msg)
        elif freed:
            self._release_slot()

    def _on_dead(self) -> None:
        code = self.process.proc.wait()
        self.process.conn.close()
        with self._lock:
            unexpected = self._state == "running"
            self._state = "dead"
            if not self._death_reason:
                self._death_reason = f"the replica process exited with code {code}"
            inboxes = list(self._calls.values())
            timers = list(self._pings.values())
            self._pings.clear()
        for timer in timers:
            timer.cancel()
        for inbox in inboxes:
            inbox.put(_DEAD)
        if self._slots is not None:
            self._slots.close()  # calls waiting for one were never sent: not run
        self._control.put(_DEAD)
        if unexpected:
            self._on_exit(self.replica_id, self._death_reason)


def _waiting_outputs(
    first: Output, inbox: queue.SimpleQueue[object]
) -> tuple[list[Any], object | None]:
    """``first``'s chunk and those of the outputs already waiting behind it (made while
    the agent reported the last), so a fast stream is reported in fewer events; and
    the first other item met (the call's end), if any."""
    chunks = [first.chunk]
    while len(chunks) < MAX_OUTPUTS_PER_EVENT:
        try:
            item = inbox.get_nowait()
        except queue.Empty:
            return chunks, None
        if not isinstance(item, Output):
            return chunks, item
        chunks.append(item.chunk)
    return chunks, None


def _to_update(item: object, death_reason: str) -> CallUpdate:
    if isinstance(item, Output):
        return CallUpdate("output", output=item.chunk)
    if isinstance(item, Result | CallError):
        # CallUpdate has CallEnd's fields but the call id (the caller knows it).
        fields = (f for f in CallEnd.model_fields if f != "call_id")
        ended: dict[str, Any] = {f: getattr(item, f) for f in fields}
        if isinstance(item, Result):
            return CallUpdate("succeeded", output=item.output, **ended)
        return CallUpdate("failed", error=item.error, fault="function", **ended)
    error = f"the replica died during the call: {death_reason}"
    return CallUpdate("failed", error=error, fault="replica")


class Slots:
    """The calls a replica runs at once (its function's target concurrency); the
    rest wait here. Closed when the replica dies: waiters learn it at once."""

    def __init__(self, size: int) -> None:
        self._free = size
        self._closed = False
        self._cond = threading.Condition()

    def take(self, deadline: float) -> Literal["ok", "timeout", "dead"]:
        """Wait (up to ``deadline``, ``time.monotonic()``) for a slot."""
        with self._cond:
            while self._free <= 0 and not self._closed:
                left_s = deadline - time.monotonic()
                if left_s <= 0:
                    return "timeout"
                self._cond.wait(left_s)
            if self._closed:
                return "dead"
            self._free -= 1
            return "ok"

    def give(self) -> None:
        with self._cond:
            self._free += 1
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


def _merge(into: dict[str, float], phases_ms: dict[str, float]) -> None:
    for name, ms in phases_ms.items():
        into[name] = into.get(name, 0.0) + ms
