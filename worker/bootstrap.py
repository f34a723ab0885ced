"""Assemble an agent from ``Settings`` and run it until SIGINT/SIGTERM.

The only place the worker reads settings; everything below gets plain
configuration objects.
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
from pathlib import Path
from types import FrameType

from control_plane import fingerprints, heap
from control_plane.settings import Settings
from control_plane.tracing import tracing_config
from snapshotter.ram_tier import RamTier
from snapshotter.ram_tier_users import TierUser
from snapshotter.registry import Registry
from snapshotter.stores import open_store
from worker.agent import Agent, AgentConfig, worker_id
from worker.call_guard import CallLimits
from worker.child_protocol import StoreSpec
from worker.consumer import BrokerConfig
from worker.control_client import ControlPlaneClient
from worker.inventory import CacheInventory
from worker.pool import ProcessPool
from worker.runtimes.base import Runtime
from worker.runtimes.process import ProcessRuntime
from worker.runtimes.routed import RoutedRuntime

log = logging.getLogger(__name__)


class MissingKeyError(Exception):
    """The worker has no API key to talk to the control plane with."""


def worker_dir(settings: Settings) -> Path:
    return settings.worker_dir or settings.home / "worker"


def store_spec(settings: Settings) -> StoreSpec:
    store = settings.store_config()
    cache = settings.cache_config()
    loader = settings.loader_config()
    ram_tier = settings.ram_tier_config()
    return StoreSpec(
        url=store.url,
        s3_endpoint_url=store.s3.endpoint_url,
        s3_region=store.s3.region,
        s3_access_key_id=store.s3.access_key_id,
        s3_secret_access_key=store.s3.secret_access_key,
        cache_dir=str(cache.directory.resolve()),
        cache_max_bytes=cache.max_bytes,
        bundles_dir=str((worker_dir(settings) / "bundles").resolve()),
        chunk_size_bytes=loader.chunk_size_bytes,
        loader_max_inflight_bytes=loader.max_inflight_bytes,
        loader_fetch_threads=loader.fetch_threads,
        loader_decode_threads=loader.decode_threads,
        loader_lease_ttl_s=loader.lease_ttl_s,
        loader_map_cache=loader.map_cache,
        ram_tier_dir=str(Path(ram_tier.directory).resolve()),
        ram_tier_max_bytes=ram_tier.max_bytes,
        ram_tier_verify=ram_tier.verify,
        ram_tier_pin_ahead=ram_tier.pin_ahead,
    )


def agent_config(settings: Settings) -> AgentConfig:
    if not settings.api_key:
        raise MissingKeyError(
            "THAW_API_KEY is not set; create a key with scope worker "
            "(`thaw keys create --scope worker`) and export it"
        )
    broker_url = settings.broker_url_resolved()
    return AgentConfig(
        state_dir=worker_dir(settings),
        server_url=settings.server_url,
        api_key=settings.api_key,
        broker=BrokerConfig(
            url=broker_url,
            folder=settings.broker_folder(),
            poll_interval_s=settings.broker_poll_interval_s,
        ),
        store=store_spec(settings),
        name=settings.worker_name or default_name(worker_dir(settings)),
        fingerprint=fingerprints.of_settings(settings),
        concurrency=settings.worker_concurrency,
        pool_size=settings.worker_pool_size,
        adapter_cache_size=settings.adapter_cache_size,
        cpu_threads=settings.worker_cpu_threads,
        cache_min_free_bytes=settings.cache_min_free_bytes,
        call_limits=CallLimits(
            settings.max_result_bytes,
            settings.max_stream_chunk_bytes,
            settings.max_error_bytes,
            settings.max_log_bytes_per_call,
        ),
        tracing=tracing_config(settings, "thaw-worker"),
        data_host=settings.worker_data_host or None,
        data_port=settings.worker_data_port,
        data_advertise_host=settings.worker_data_advertise_host,
        drain_grace_s=settings.drain_grace_s,
    )


def default_name(state_dir: Path) -> str:
    """The host name and the start of this agent's worker id: two workers on one
    host get two names, and a restarted one keeps its own."""
    return f"{socket.gethostname()}-{worker_id(state_dir)[:6]}"


def build_agent(settings: Settings) -> Agent:
    config = agent_config(settings)
    registry = Registry(open_store(settings.store_config()))
    pool = ProcessPool(
        config.pool_size,
        store=config.store,
        preload=preload_modules(settings),
        zygote=settings.worker_pool_zygote,
        host_bytes_max=settings.worker_pool_host_bytes_max,
        refill_delay_s=settings.worker_pool_refill_delay_s,
    )
    process = ProcessRuntime(pool, answer_timeout_s=settings.replica_answer_timeout_s)
    runtime = RoutedRuntime(process, lambda: _docker_runtime(settings, config))
    client = ControlPlaneClient(config.server_url, config.api_key)
    inventory = CacheInventory(settings.cache_config(), registry, ram_tier=_ram_tier(settings))
    return Agent(config, runtime, client, inventory)


def preload_modules(settings: Settings) -> tuple[str, ...]:
    return tuple(m.strip() for m in settings.worker_pool_preload.split(",") if m.strip())


def _ram_tier(settings: Settings) -> RamTier | None:
    config = settings.ram_tier_config()
    return RamTier(config) if config.max_bytes > 0 else None


def _docker_runtime(settings: Settings, config: AgentConfig) -> Runtime:
    from worker.runtimes.docker import DockerConfig, DockerRuntime

    return DockerRuntime(
        DockerConfig(
            store=config.store,
            state_dir=(config.state_dir / "containers").resolve(),
            docker_url=settings.docker_url,
            warm_size=settings.docker_warm_size,
        )
    )


def serve(settings: Settings) -> None:
    """Run an agent in this process until SIGINT or SIGTERM; then stop cleanly, and
    remove the home's default RAM tier when no other worker uses it."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("received %s: draining, then stopping", signal.Signals(signum).name)
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    tier_user: TierUser | None = None
    try:
        tier_user = _join_ram_tier(settings)
        agent = build_agent(settings)
        if all(d.kind == "cpu" for d in agent.devices):
            log.warning("no CUDA device found: functions on this worker run on the CPU")
        heap.freeze()  # torch and the agent's parts, imported and built by now
        agent.run(stop)  # returns once the replicas are stopped
    finally:
        if tier_user is not None and tier_user.leave():
            log.info("removed the RAM tier %s: no other worker uses it", tier_user.directory)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _join_ram_tier(settings: Settings) -> TierUser | None:
    """Count this worker among the users of a tier it removes when it stops last."""
    config = settings.ram_tier_config()
    if config.max_bytes <= 0 or not config.remove_when_unused:
        return None
    return TierUser.join(config.directory)
