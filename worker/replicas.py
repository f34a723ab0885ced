"""The worker's replicas: start, stop and call them, and tell the control plane.

``ReplicaManager`` applies the three Celery tasks (each runs on a consumer
thread and blocks until it is done) and the heartbeat's orders. It owns the
map replica id → handle; the runtime owns the processes.

Every accepted ``RunCall`` ends in exactly one final ``CallEvent``
(``succeeded``, ``failed``, ``timeout`` or ``cancelled``), unless the control
plane answers 409 (already final there). A delivery of a (call id, attempt)
this worker has already run is skipped: late acks may deliver twice.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from control_plane.protocol import (
    CallEvent,
    ReplicaEvent,
    ReplicaReport,
    RunCall,
    StartReplica,
    StopReplica,
)
from control_plane.tracing import NO_TRACING, Tracing
from worker.call_guard import CallLimits, guard, output_groups, redact, refused_as_too_large
from worker.child_protocol import AdapterRef, ContainerSpec, ReplicaSpec, StoreSpec
from worker.control_client import ControlPlaneClient, ControlPlaneError
from worker.inventory import BandwidthMeter
from worker.runtimes.base import (
    CallRequest,
    CallUpdate,
    Relay,
    ReplicaHandle,
    ReplicaStartError,
    Runtime,
)
from worker.tracing import run_call_spans, start_replica_spans

log = logging.getLogger(__name__)
MAX_SEEN_CALLS = 100_000


@dataclass
class _Entry:
    spec: ReplicaSpec
    handle: ReplicaHandle | None = None  # None while starting
    secrets: dict[str, str] = field(default_factory=dict, repr=False)  # redacted from calls
    model_digests: tuple[str, ...] = ()
    draining: bool = False  # the worker is stopping: it finishes its calls, takes no more


@dataclass
class _Seen:
    """(call id, attempt) pairs already run, oldest first, bounded."""

    keys: dict[tuple[str, int], None] = field(default_factory=dict)

    def add(self, key: tuple[str, int]) -> bool:
        if key in self.keys:
            return False
        self.keys[key] = None
        if len(self.keys) > MAX_SEEN_CALLS:
            self.keys.pop(next(iter(self.keys)))
        return True


class _Outputs:
    """A call's streamed outputs as reported: numbered in order, none after its end.
    A relay reports them on the runtime's thread while the call's thread waits for
    the end; ``lock`` keeps the two apart."""

    def __init__(self) -> None:
        self.sent = 0
        self.ended = False
        self.lock = threading.Lock()

    def event(self, msg: RunCall, group: list[Any]) -> CallEvent:
        """The output event of ``group``, the chunks after those sent."""
        several = {"outputs": group} if len(group) > 1 else {"output": group[0]}
        return CallEvent(attempt=msg.attempt, kind="output", seq=self.sent + 1, **several)

    def end(self) -> None:
        with self.lock:  # waits out a relay's write in progress
            self.ended = True


class ReplicaManager:
    def __init__(
        self,
        runtime: Runtime,
        client: ControlPlaneClient,
        store: StoreSpec | None,
        *,
        clock: Callable[[], float] = time.time,
        adapter_cache_size: int = 8,
        cpu_threads: int = 0,
        tracing: Tracing = NO_TRACING,
        call_limits: CallLimits = CallLimits(),
    ) -> None:
        self.runtime = runtime
        self.call_limits = call_limits  # what one call may report (worker.call_guard)
        self.client = client
        self.store = store
        self.clock = clock
        self.adapter_cache_size = adapter_cache_size
        self.cpu_threads = cpu_threads or default_cpu_threads()
        # Threads left to the default: a heavy LLM step may take the serving path's core.
        self.cpu_cores = None if cpu_threads else (os.cpu_count() or 1)
        self.tracing = tracing  # spans of the calls it runs (worker.tracing)
        self.bandwidth = BandwidthMeter()  # from the loads replicas report at ready
        self._lock = threading.Lock()
        self._replicas: dict[str, _Entry] = {}
        self._cancelled: set[str] = set()
        self._seen = _Seen()
        self._loaded_digests: set[str] = set()
        # call id -> where its events go first (a direct call's connection), see run_direct
        self._sinks: dict[str, Callable[[CallEvent], bool]] = {}
        self._running: dict[str, ReplicaHandle] = {}  # call id -> its replica, while it runs
        self._closed = False

    def close(self) -> None:
        """Refuse new replicas and calls from now on (the worker is shutting down)."""
        with self._lock:
            self._closed = True

    # --- replicas ------------------------------------------------------------
    def start_replica(self, msg: StartReplica) -> None:
        spec = self._spec(msg)
        with self._lock:
            if msg.replica_id in self._replicas:
                return  # a redelivery of a start already under way or done
            closed = self._closed
            if not closed:
                self._replicas[msg.replica_id] = _Entry(spec, secrets=dict(msg.secrets))
        if closed:
            event = ReplicaEvent(state="failed", error="the worker is shutting down")
            self._report(msg.replica_id, event)
            return
        self._report(msg.replica_id, ReplicaEvent(state="starting"))
        try:
            handle = self.runtime.start(spec, self._on_exit)
        except ReplicaStartError as exc:
            with self._lock:
                self._replicas.pop(msg.replica_id, None)
            self._report(
                msg.replica_id,
                ReplicaEvent(
                    state="failed",
                    error=redact(str(exc), msg.secrets),
                    phases_ms=exc.phases_ms,
                    fault=exc.fault if exc.fault == "function" else None,
                ),
            )
            return
        with self._lock:
            entry = self._replicas.get(msg.replica_id)
            if entry is not None:
                entry.handle = handle
                self._loaded_digests.update(_artifact_digests(spec))
        if entry is None:  # stopped while it was starting
            handle.stop()
            return
        self.bandwidth.observe(handle.loads)
        # The span ends when the replica was ready, before the report that lets
        # the call run: read after it, a fast call's span could end first.
        ready_s = self.clock()
        self._report(msg.replica_id, ReplicaEvent(state="ready", phases_ms=handle.phases_ms))
        self.tracing.emit(start_replica_spans(msg, handle.phases_ms, ready_s))

    def _spec(self, msg: StartReplica) -> ReplicaSpec:
        return ReplicaSpec(
            replica_id=msg.replica_id,
            function=msg.function,
            version=msg.version,
            bundle_digest=msg.bundle_digest,
            entry=msg.entry,
            model_digest=msg.model_digest,
            adapters=[AdapterRef(name=a.name, digest=a.digest) for a in msg.adapters],
            device="cuda" if msg.device == "cuda" else "cpu",
            env={**msg.env, **msg.secrets},
            secret_names=sorted(msg.secrets),
            max_log_bytes_per_call=self.call_limits.max_log_bytes_per_call,
            store=self.store,
            container=ContainerSpec(**msg.container.model_dump()) if msg.container else None,
            adapter_cache_size=self.adapter_cache_size,
            max_batch_size=msg.max_batch_size,
            max_wait_ms=msg.max_wait_ms,
            max_concurrent_calls=msg.max_concurrent_calls,
            llm=msg.llm,
            cpu_threads=replica_cpu_threads(self.cpu_threads, msg),
            cpu_cores=replica_cpu_cores(self.cpu_cores, msg),
        )

    def stop_by_id(self, replica_id: str, reason: str) -> None:
        self.stop_replica(StopReplica(replica_id=replica_id, reason=reason))

    def stop_replica(self, msg: StopReplica) -> None:
        with self._lock:
            entry = self._replicas.pop(msg.replica_id, None)
        if entry is None:
            return
        if entry.handle is not None:
            entry.handle.stop()
        self._report(msg.replica_id, ReplicaEvent(state="stopped", error=msg.reason or None))

    def stop_all(self) -> None:
        with self._lock:
            ids = list(self._replicas)
        for replica_id in ids:
            self.stop_by_id(replica_id, "the worker is shutting down")

    def drain(self) -> None:
        """The first step of a graceful stop: refuse new replicas and calls; stop the
        replicas that run no call now, and report the others ``draining`` (the control
        plane sends them nothing more and leaves new calls queued)."""
        self.close()
        with self._lock:
            entries = list(self._replicas.items())
        for replica_id, entry in entries:
            if entry.handle is None or entry.handle.outstanding_calls == 0:
                self.stop_by_id(replica_id, "the worker is shutting down")
                continue
            entry.draining = True
            self._report(replica_id, ReplicaEvent(state="draining"))

    def running_calls(self) -> int:
        """Calls running on this worker's replicas now."""
        with self._lock:
            handles = [e.handle for e in self._replicas.values() if e.handle is not None]
        return sum(h.outstanding_calls for h in handles)

    def _on_exit(self, replica_id: str, reason: str) -> None:
        with self._lock:
            entry = self._replicas.pop(replica_id, None)
        if entry is not None:
            self._await_calls_of(entry.handle)
            self._report(replica_id, ReplicaEvent(state="failed", error=reason))

    def _await_calls_of(self, handle: ReplicaHandle | None, max_wait_s: float = 5.0) -> None:
        """Let the calls a dead replica held report first: each says whether it ever
        started, which decides whether its retry is spent (the replica's own event
        would retry them all alike)."""
        deadline = time.monotonic() + max_wait_s
        while time.monotonic() < deadline:
            with self._lock:
                if handle not in self._running.values():
                    return
            time.sleep(0.01)

    def reports(self) -> list[ReplicaReport]:
        with self._lock:
            entries = list(self._replicas.items())
        return [
            ReplicaReport(
                replica_id=rid,
                state="starting" if e.handle is None else "draining" if e.draining else "ready",
                outstanding_calls=0 if e.handle is None else e.handle.outstanding_calls,
                llm=None if e.handle is None else e.handle.engine_stats,
            )
            for rid, e in entries
        ]

    def loaded_digests(self) -> set[str]:
        """Model and adapter manifests replicas on this worker have loaded."""
        with self._lock:
            return set(self._loaded_digests)

    # --- calls ---------------------------------------------------------------
    def cancel(self, call_ids: list[str]) -> None:
        """Calls to end as cancelled: a running one is stopped in its replica, and
        reported cancelled at its next update."""
        with self._lock:
            self._cancelled.update(call_ids)
            running = [(c, self._running[c]) for c in call_ids if c in self._running]
        for call_id, handle in running:
            handle.cancel(call_id)

    def run_direct(self, msg: RunCall, sink: Callable[[CallEvent], bool]) -> None:
        """Run a call that came over the direct port: its events go to ``sink``, and
        over HTTP only where ``sink`` fails (the connection is gone)."""
        with self._lock:
            self._sinks[msg.call_id] = sink
        try:
            self.run_call(msg)
        finally:
            with self._lock:
                self._sinks.pop(msg.call_id, None)

    def run_call(self, msg: RunCall) -> None:
        with self._lock:
            fresh = self._seen.add((msg.call_id, msg.attempt))
            entry = self._replicas.get(msg.replica_id)
        if not fresh:
            return
        started_s = self.clock()
        timings = {"queue_wait": max(0.0, (started_s - msg.accepted_at) * 1000)}
        handle = entry.handle if entry is not None else None
        if handle is None or not handle.alive or self._closed:
            # Never started: the control plane runs it again while retries remain.
            error = f"replica {msg.replica_id} is not running on this worker"
            self._event(
                msg, CallEvent(attempt=msg.attempt, kind="failed", error=error, not_run=True)
            )
            return
        started = CallEvent(attempt=msg.attempt, kind="started", timings_ms=timings)
        if msg.report_started and not self._event(msg, started):
            return
        outputs = _Outputs()
        request = CallRequest(
            msg.call_id,
            msg.input,
            msg.adapter,
            msg.attempt,
            msg.timeout_s,
            msg.stream,
            relay=self._relay(msg, outputs) if msg.stream else None,
        )
        with self._lock:
            self._running[msg.call_id] = handle
        try:
            self._forward(msg, handle.call(request), timings, started_s, outputs)
        finally:
            outputs.end()  # a relay reports nothing after the call's end, or once it left
            with self._lock:
                self._running.pop(msg.call_id, None)

    def _relay(self, msg: RunCall, outputs: _Outputs) -> Relay | None:
        """For a direct call: its outputs reported on the runtime's thread as they come,
        over the call's connection only. A failed write, an output over the cap or a
        cancel leaves the outputs to the call's thread, which reports them over HTTP,
        or ends the call, as it would have."""
        sink = self._sinks.get(msg.call_id)
        if sink is None:
            return None
        secrets = self._secrets(msg.replica_id)
        limit = self.call_limits.max_stream_chunk_bytes

        def relay(chunks: list[Any]) -> int:
            taken = 0
            with outputs.lock:
                if outputs.ended:
                    return len(chunks)  # the call is over: dropped, as its thread would
                for group in output_groups(chunks, limit):
                    if msg.call_id in self._cancelled:
                        break
                    event = guard(outputs.event(msg, group), self.call_limits, secrets)
                    if event.kind != "output" or not sink(event):
                        break
                    outputs.sent += len(group)
                    taken += len(group)
            return taken

        return relay

    def _forward(
        self,
        msg: RunCall,
        updates: Iterator[CallUpdate],
        timings: dict[str, float],
        started_s: float,
        outputs: _Outputs,
    ) -> None:
        """Report a running call's updates, until its final one or a cancel."""
        for update in updates:
            if self._take_cancel(msg.call_id):
                self._final(msg, CallUpdate("cancelled"), timings, started_s, outputs)
                return
            if not update.final:
                limit = self.call_limits.max_stream_chunk_bytes
                for group in output_groups(update.chunks(), limit):
                    output = outputs.event(msg, group)
                    outputs.sent += len(group)
                    if not self._event(msg, output):
                        return
                continue
            self._final(msg, update, timings, started_s, outputs)

    def _take_cancel(self, call_id: str) -> bool:
        with self._lock:
            if call_id in self._cancelled:
                self._cancelled.discard(call_id)
                return True
            return False

    def _final(
        self,
        msg: RunCall,
        update: CallUpdate,
        timings: dict[str, float],
        started_s: float,
        outputs: _Outputs,
    ) -> None:
        outputs.end()  # no output may follow the final event (nor reach the next call)
        merged = {**timings, **update.timings_ms, "total": (self.clock() - msg.accepted_at) * 1000}
        merged.setdefault("execution", (self.clock() - started_s) * 1000)
        if "first_output" in update.timings_ms:  # the child measures from execution start
            merged["first_output"] = timings["queue_wait"] + update.timings_ms["first_output"]
        event = CallEvent(
            attempt=msg.attempt,
            kind=update.kind,
            output=update.output if update.kind == "succeeded" else None,
            error=update.error,
            timings_ms=merged,
            adapter_hit=update.adapter_hit,
            loaded_adapters=update.loaded_adapters,
            batch_size=update.batch_size,
            batch_index=update.batch_index,
            usage=update.usage,
            token_gaps_ms=update.token_gaps_ms,
            fault=update.fault if update.kind == "failed" else None,
            not_run=update.not_run or None,
        )
        ended_s = self.clock()
        self._event(msg, event)
        if self.tracing.enabled:  # spans are built only to be sent
            self.tracing.emit(run_call_spans(msg, event, started_s, ended_s))

    # --- reporting -----------------------------------------------------------
    def _event(self, msg: RunCall, event: CallEvent) -> bool:
        """Report ``event`` redacted and capped (``worker.call_guard``); ``False`` when the
        call is over: final there already, or ended here by an output over the cap."""
        guarded = guard(event, self.call_limits, self._secrets(msg.replica_id))
        sent = self._send_event(msg, guarded)
        return sent and guarded.kind == event.kind

    def _secrets(self, replica_id: str) -> dict[str, str]:
        """The secrets given to the replica, hidden in whatever its calls report."""
        with self._lock:
            entry = self._replicas.get(replica_id)
        return entry.secrets if entry is not None else {}

    def _send_event(self, msg: RunCall, event: CallEvent) -> bool:
        sink = self._sinks.get(msg.call_id)
        if sink is not None and sink(event):
            return True
        try:
            return self.client.call_event(msg.call_id, event)
        except ControlPlaneError as exc:
            log.exception("could not report %s of call %s", event.kind, msg.call_id)
            if exc.status_code == 413 and event.kind in ("output", "succeeded"):
                # Over the control plane's body cap: end the call failed, never leave it running.
                self._send_event(msg, refused_as_too_large(event))
            return False

    def _report(self, replica_id: str, event: ReplicaEvent) -> None:
        try:
            self.client.replica_event(replica_id, event)
        except ControlPlaneError:
            log.exception("could not report replica %s as %s", replica_id, event.state)


def _artifact_digests(spec: ReplicaSpec) -> list[str]:
    return ([spec.model_digest] if spec.model_digest else []) + [a.digest for a in spec.adapters]


def default_cpu_threads() -> int:
    """The worker's cores less one: a CPU replica's intra-op threads spin on every core
    they have, and the agent, the serving path (and on one machine the control plane)
    need one to pass tokens on. On 2 cores, 8 LLM streams: 415 -> 905 tokens/s."""
    return max(1, (os.cpu_count() or 1) - 1)


def replica_cpu_threads(worker_threads: int, msg: StartReplica) -> int:
    """A replica's torch threads: the worker's, at most its container's ``cpus``."""
    cpus = msg.container.cpus if msg.container is not None else None
    return max(1, min(worker_threads, math.ceil(cpus))) if cpus else worker_threads


def replica_cpu_cores(worker_cores: int | None, msg: StartReplica) -> int | None:
    """The cores a replica may use for a heavy LLM step: the worker's, at most its
    container's ``cpus``; None where the worker was given a thread count."""
    if worker_cores is None:
        return None
    return replica_cpu_threads(worker_cores, msg)
