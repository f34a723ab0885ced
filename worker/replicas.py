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
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from control_plane.protocol import (
    CallEvent,
    ReplicaEvent,
    ReplicaReport,
    RunCall,
    StartReplica,
    StopReplica,
)
from worker.child_protocol import AdapterRef, ContainerSpec, ReplicaSpec, StoreSpec
from worker.control_client import ControlPlaneClient, ControlPlaneError
from worker.inventory import BandwidthMeter
from worker.runtimes.base import CallRequest, CallUpdate, ReplicaHandle, ReplicaStartError, Runtime

log = logging.getLogger(__name__)
MAX_SEEN_CALLS = 100_000


@dataclass
class _Entry:
    spec: ReplicaSpec
    handle: ReplicaHandle | None = None  # None while starting
    model_digests: tuple[str, ...] = ()


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


class ReplicaManager:
    def __init__(
        self,
        runtime: Runtime,
        client: ControlPlaneClient,
        store: StoreSpec | None,
        *,
        clock: Callable[[], float] = time.time,
        adapter_cache_size: int = 8,
    ) -> None:
        self.runtime = runtime
        self.client = client
        self.store = store
        self.clock = clock
        self.adapter_cache_size = adapter_cache_size
        self.bandwidth = BandwidthMeter()  # from the loads replicas report at ready
        self._lock = threading.Lock()
        self._replicas: dict[str, _Entry] = {}
        self._cancelled: set[str] = set()
        self._seen = _Seen()
        self._loaded_digests: set[str] = set()
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
                self._replicas[msg.replica_id] = _Entry(spec)
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
                ReplicaEvent(state="failed", error=str(exc), phases_ms=exc.phases_ms),
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
        self._report(msg.replica_id, ReplicaEvent(state="ready", phases_ms=handle.phases_ms))

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
            env=dict(msg.env),
            store=self.store,
            container=ContainerSpec(**msg.container.model_dump()) if msg.container else None,
            adapter_cache_size=self.adapter_cache_size,
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

    def _on_exit(self, replica_id: str, reason: str) -> None:
        with self._lock:
            entry = self._replicas.pop(replica_id, None)
        if entry is not None:
            self._report(replica_id, ReplicaEvent(state="failed", error=reason))

    def reports(self) -> list[ReplicaReport]:
        with self._lock:
            entries = list(self._replicas.items())
        return [
            ReplicaReport(
                replica_id=rid,
                state="starting" if e.handle is None else "ready",
                outstanding_calls=0 if e.handle is None else e.handle.outstanding_calls,
            )
            for rid, e in entries
        ]

    def loaded_digests(self) -> set[str]:
        """Model and adapter manifests replicas on this worker have loaded."""
        with self._lock:
            return set(self._loaded_digests)

    # --- calls ---------------------------------------------------------------
    def cancel(self, call_ids: list[str]) -> None:
        """Calls to end as cancelled; a running one stops being forwarded at its next update."""
        with self._lock:
            self._cancelled.update(call_ids)

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
            error = f"replica {msg.replica_id} is not running on this worker; retry the call"
            self._final(msg, CallUpdate("failed", error=error), timings, started_s)
            return
        if not self._event(msg, CallEvent(attempt=msg.attempt, kind="started", timings_ms=timings)):
            return
        request = CallRequest(
            msg.call_id, msg.input, msg.adapter, msg.attempt, msg.timeout_s, msg.stream
        )
        for update in handle.call(request):
            if self._take_cancel(msg.call_id):
                self._final(msg, CallUpdate("cancelled"), timings, started_s)
                return
            if not update.final:
                if not self._event(
                    msg, CallEvent(attempt=msg.attempt, kind="output", output=update.output)
                ):
                    return
                continue
            self._final(msg, update, timings, started_s)

    def _take_cancel(self, call_id: str) -> bool:
        with self._lock:
            if call_id in self._cancelled:
                self._cancelled.discard(call_id)
                return True
            return False

    def _final(
        self, msg: RunCall, update: CallUpdate, timings: dict[str, float], started_s: float
    ) -> None:
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
        )
        self._event(msg, event)

    # --- reporting -----------------------------------------------------------
    def _event(self, msg: RunCall, event: CallEvent) -> bool:
        try:
            return self.client.call_event(msg.call_id, event)
        except ControlPlaneError:
            log.exception("could not report %s of call %s", event.kind, msg.call_id)
            return False

    def _report(self, replica_id: str, event: ReplicaEvent) -> None:
        try:
            self.client.replica_event(replica_id, event)
        except ControlPlaneError:
            log.exception("could not report replica %s as %s", replica_id, event.state)


def _artifact_digests(spec: ReplicaSpec) -> list[str]:
    return ([spec.model_digest] if spec.model_digest else []) + [a.digest for a in spec.adapters]
