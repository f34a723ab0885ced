"""The worker agent: register, heartbeat, consume, and shut down cleanly.

One agent per machine. ``Agent.run`` blocks until its stop event is set
(the CLI sets it on SIGINT/SIGTERM)::

    register ──▶ start consumer ──▶ heartbeat every interval ──▶ stop event
                                                                    │
      drain: refuse new calls and replicas, stop idle replicas, ◀───┘
      report busy ones draining, heartbeat "unhealthy: draining"
      until the running calls end or ``drain_grace_s`` passes
                                                                    │
      stop consumer ◀── stop every replica ◀────────────────────────┘

Draining leaves calls that have not started queued in the control plane (no
replica here takes them; none is placed here) for the next worker or start.

The worker id is generated once and kept in ``<state_dir>/id``, so a
restarted agent is the same worker to the control plane and finds messages
still in its queue.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from control_plane.fingerprints import Fingerprint
from control_plane.protocol import WorkerHeartbeat, WorkerRegister
from control_plane.tracing import TracingConfig, open_tracing
from worker.call_guard import CallLimits
from worker.child_protocol import StoreSpec
from worker.consumer import BrokerConfig, Consumer, Handlers
from worker.control_client import ControlPlaneClient, ControlPlaneError
from worker.dataplane import DataServer
from worker.devices import (
    default_device,
    detect_devices,
    free_memory_bytes,
    gpu_utilization_pct,
    total_memory_bytes,
)
from worker.health import DEFAULT_CACHE_MIN_FREE_BYTES, HEALTHY, Health, check_cache_disk
from worker.inventory import CacheInventory, InventoryReport, bandwidths
from worker.replicas import ReplicaManager
from worker.runtimes.base import Runtime

log = logging.getLogger(__name__)
DRAIN_POLL_S = 0.1
DRAINING = Health(False, "draining: the worker is shutting down")


@dataclass(frozen=True)
class AgentConfig:
    state_dir: Path  # this agent's own: its id lives here (two agents need two)
    server_url: str
    api_key: str
    broker: BrokerConfig
    store: StoreSpec
    name: str = ""
    concurrency: int = 32
    pool_size: int = 0
    adapter_cache_size: int = 8
    cpu_threads: int = 0  # torch threads of a CPU replica (0: the cores less one)
    # Less free than this on the cache disk: unhealthy, no new replicas (worker.health).
    cache_min_free_bytes: int = DEFAULT_CACHE_MIN_FREE_BYTES
    call_limits: CallLimits | None = None  # result and error caps per call (None: defaults)
    tracing: TracingConfig | None = None  # None: no spans
    # The direct call port (``worker.dataplane``): where it listens, and the host the
    # control plane should dial (None: the listening host). ``data_host=None`` turns it off.
    data_host: str | None = "127.0.0.1"
    data_port: int = 0
    data_advertise_host: str | None = None
    # On a stop, how long running calls may go on before the replicas are stopped.
    drain_grace_s: float = 30.0
    # Where this agent's broker and store are (sent at registration; the control plane
    # refuses a worker whose are not its own). None: not sent.
    fingerprint: Fingerprint | None = None


def worker_id(state_dir: Path) -> str:
    """This agent's worker id, created on first use."""
    path = state_dir / "id"
    if path.is_file():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    new_id = uuid.uuid4().hex
    path.write_text(new_id + "\n")
    return new_id


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        runtime: Runtime,
        client: ControlPlaneClient,
        inventory: CacheInventory | None = None,
    ) -> None:
        self.config = config
        self.runtime = runtime
        self.client = client
        self.inventory = inventory
        self.worker_id = worker_id(config.state_dir)
        self.manager = ReplicaManager(
            runtime,
            client,
            config.store,
            adapter_cache_size=config.adapter_cache_size,
            cpu_threads=config.cpu_threads,
            tracing=open_tracing(config.tracing),
            call_limits=config.call_limits or CallLimits(),
        )
        self.devices = detect_devices()
        self.heartbeat_interval_s = 2.0
        self._health = HEALTHY
        self._draining = False
        self.data: DataServer | None = None
        if config.data_host is not None:
            self.data = DataServer(
                self.manager.run_direct,
                config.data_host,
                config.data_port,
                cancel=self.manager.cancel,
            )

    def register(self) -> None:
        cached, cache_bytes = self._cache()
        fp = self.config.fingerprint
        reply = self.client.register(
            WorkerRegister(
                worker_id=self.worker_id,
                name=self.config.name,
                devices=self.devices,
                memory_bytes=total_memory_bytes(),
                pool_size=self.config.pool_size,
                cached_manifests=cached,
                cache_bytes=cache_bytes,
                data_addr=self._data_addr(),
                data_token=self.data.token if self.data is not None else None,
                broker=fp.broker if fp is not None else None,
                store=fp.store if fp is not None else None,
            )
        )
        self.heartbeat_interval_s = reply.heartbeat_interval_s
        log.info("registered as worker %s, consuming %s", self.worker_id, reply.queue)

    def _data_addr(self) -> str | None:
        if self.data is None:
            return None
        host = self.config.data_advertise_host or self.config.data_host
        return f"{host}:{self.data.port}"

    def run(self, stop: threading.Event) -> None:
        """Serve until ``stop`` is set; always stops replicas and the consumer."""
        if self.data is not None:
            self.data.start()
        try:
            self.register()
        except BaseException:  # refused or unreachable: leave nothing running behind
            if self.data is not None:
                self.data.stop()
            self.runtime.close()
            self.client.close()
            raise
        handlers = Handlers(
            self.manager.start_replica, self.manager.stop_replica, self.manager.run_call
        )
        consumer = Consumer(self.config.broker, self.worker_id, handlers, self.config.concurrency)
        consumer.start()
        # The zygote and the pool's processes start in the background.
        device = default_device(self.devices)
        threading.Thread(target=self._prewarm, args=(device,), daemon=True).start()
        try:
            while not stop.wait(self.heartbeat_interval_s):
                if not consumer.running:
                    raise RuntimeError(f"the Celery consumer stopped: {consumer.error!r}")
                self.heartbeat()
            self.drain()
        finally:
            self.manager.close()
            if self.data is not None:
                self.data.stop()
            self.manager.stop_all()
            consumer.stop()
            self.runtime.close()
            self.client.close()
            self.manager.tracing.close()

    def drain(self, clock: Callable[[], float] = time.monotonic) -> None:
        """Take no new work; let running calls finish up to ``drain_grace_s``, still
        heartbeating (the worker stays known, and unhealthy: no replica is placed here)."""
        self._draining = True
        self.manager.drain()
        running = self.manager.running_calls()
        if running:
            log.info(
                "draining: waiting up to %g s for %d running call(s)",
                self.config.drain_grace_s,
                running,
            )
        deadline = clock() + self.config.drain_grace_s
        self.heartbeat()
        beat_at = clock()
        while self.manager.running_calls() and clock() < deadline:
            time.sleep(min(DRAIN_POLL_S, max(0.0, deadline - clock())))
            if clock() - beat_at >= self.heartbeat_interval_s:
                self.heartbeat()
                beat_at = clock()
        left = self.manager.running_calls()
        if left:
            log.warning(
                "drain grace of %g s over: stopping replicas with %d call(s) still running",
                self.config.drain_grace_s,
                left,
            )

    def _reregister(self) -> None:
        try:
            self.register()
        except ControlPlaneError as exc:
            log.warning("registering again failed: %s", exc)

    def _prewarm(self, device: str) -> None:
        try:
            self.runtime.prewarm_device(device)
        except Exception:
            log.exception("could not pre-warm replica processes for %s", device)

    def heartbeat(self) -> None:
        msg = self.heartbeat_message()
        try:
            reply = self.client.heartbeat(self.worker_id, msg)
        except ControlPlaneError as exc:
            log.warning("heartbeat failed: %s", exc)
            if exc.status_code == 404:  # the control plane forgot us (a new database)
                self._reregister()
            return
        self.manager.cancel(reply.cancel_call_ids)
        for replica_id in reply.stop_replica_ids:
            threading.Thread(
                target=self.manager.stop_by_id,
                args=(replica_id, "the control plane asked"),
                daemon=True,
            ).start()

    def heartbeat_message(self) -> WorkerHeartbeat:
        """Replicas, tier holdings and bandwidths, memory and pool, as of now."""
        report = self._report()
        idle, busy = self.runtime.pool_counts() or (None, None)
        health = self.check_health()
        return WorkerHeartbeat(
            replicas=self.manager.reports(),
            cached_manifests=report.cached_manifests,
            cache_bytes=report.cache_bytes,
            free_memory_bytes=free_memory_bytes(),
            pool_size=self.config.pool_size,
            healthy=health.healthy,
            unhealthy_reason=health.reason,
            holdings=report.holdings,
            bandwidths=bandwidths(report, self.manager.bandwidth),
            pool_idle=idle,
            pool_busy=busy,
            gpu_utilization_pct=gpu_utilization_pct(),
        )

    def check_health(self) -> Health:
        """This worker's health now (see ``worker.health``); logs each change."""
        cache_dir = Path(self.config.store.cache_dir)
        health = check_cache_disk(cache_dir, self.config.cache_min_free_bytes)
        if self._draining:
            health = DRAINING
        if health != self._health:
            if health.healthy:
                log.info("healthy again: the cache disk has room")
            else:
                log.warning("unhealthy, taking no new replicas: %s", health.reason)
        self._health = health
        return health

    def _cache(self) -> tuple[list[str], int]:
        report = self._report()
        return report.cached_manifests, report.cache_bytes

    def _report(self) -> InventoryReport:
        if self.inventory is None:
            return InventoryReport([], 0, [], None)
        return self.inventory.report(self.manager.loaded_digests())
