"""Every setting of every thaw process, in one place (env prefix ``THAW_``).

| setting                    | env                          | default              |
| -------------------------- | ---------------------------- | -------------------- |
| home                       | THAW_HOME                    | ./.thaw              |
| store                      | THAW_STORE                   | <home>/store         |
| s3_endpoint_url            | THAW_S3_ENDPOINT_URL         | (AWS)                |
| s3_region                  | THAW_S3_REGION               | us-east-1            |
| s3_access_key_id           | THAW_S3_ACCESS_KEY_ID        | (boto3 chain)        |
| s3_secret_access_key       | THAW_S3_SECRET_ACCESS_KEY    | (boto3 chain)        |
| cache_dir                  | THAW_CACHE_DIR               | <home>/cache         |
| cache_max_bytes            | THAW_CACHE_MAX_BYTES         | 64 GiB               |
| cache_min_free_bytes       | THAW_CACHE_MIN_FREE_BYTES    | 64 MiB (less free on the cache disk: worker unhealthy) |
| ram_tier_dir               | THAW_RAM_TIER_DIR            | /dev/shm/thaw-<home hash> (removed by the home's last worker to stop; a set one never is) |
| ram_tier_max_bytes         | THAW_RAM_TIER_MAX_BYTES      | 25% of RAM (0: off)  |
| ram_tier_verify            | THAW_RAM_TIER_VERIFY         | true (checksum on read) |
| ram_tier_pin_ahead         | THAW_RAM_TIER_PIN_AHEAD      | true (a CUDA pool process pins the tier's pages while it waits) |
| chunk_size_bytes           | THAW_CHUNK_SIZE_BYTES        | 8 MiB                |
| loader_max_inflight_bytes  | THAW_LOADER_MAX_INFLIGHT_BYTES | 256 MiB            |
| loader_fetch_threads       | THAW_LOADER_FETCH_THREADS    | 16                   |
| loader_decode_threads      | THAW_LOADER_DECODE_THREADS   | 4                    |
| loader_map_cache           | THAW_LOADER_MAP_CACHE        | true (a CPU load maps the disk cache's pages, no copy) |
| lease_ttl_s                | THAW_LEASE_TTL_S             | 120 (a load's gc lease; 0: none) |
| gc_grace_s                 | THAW_GC_GRACE_S              | 3600 (`thaw gc` keeps younger objects) |
| database_url               | THAW_DATABASE_URL            | sqlite:///<home>/thaw.db |
| broker_url                 | THAW_BROKER_URL              | filesystem:// under <home>/broker |
| broker_poll_interval_s     | THAW_BROKER_POLL_INTERVAL_S  | 0.02 (filesystem broker: how often a worker looks for messages) |
| server_url                 | THAW_SERVER_URL              | http://127.0.0.1:8420 |
| api_key                    | THAW_API_KEY                 | (none; CLI and worker key) |
| server_host                | THAW_SERVER_HOST             | 127.0.0.1            |
| server_port                | THAW_SERVER_PORT             | 8420                 |
| server_processes           | THAW_SERVER_PROCESSES        | 1 (control-plane processes behind the one port; one per core to use them all) |
| peer_dir                   | THAW_PEER_DIR                | (set by `thaw server` for its processes: where they find each other and share rate-limit buckets) |
| admin_key_file             | THAW_ADMIN_KEY_FILE          | (none; first admin key copy) |
| auth_cache_ttl_s           | THAW_AUTH_CACHE_TTL_S        | 2 (a verified key is trusted this long; a revoke through another server takes this long here; 0: off) |
| secrets_key                | THAW_SECRETS_KEY             | (<home>/secrets.key, made on first use; one key for all control planes) |
| max_body_bytes             | THAW_MAX_BODY_BYTES          | 6 MiB                |
| max_body_depth             | THAW_MAX_BODY_DEPTH          | 64 (arrays and objects nested in an invoke body, the body itself counting 1; at most 200) |
| max_upload_bytes           | THAW_MAX_UPLOAD_BYTES        | 64 GiB (console folder uploads) |
| max_result_bytes           | THAW_MAX_RESULT_BYTES        | 4 MiB (a bigger result fails the call; worker) |
| max_stream_chunk_bytes     | THAW_MAX_STREAM_CHUNK_BYTES  | 1 MiB (a bigger streamed output fails the call) |
| max_error_bytes            | THAW_MAX_ERROR_BYTES         | 64 KiB (longer error messages are cut, marked) |
| max_log_bytes_per_call     | THAW_MAX_LOG_BYTES_PER_CALL  | 1 MiB (what a call prints past this is dropped, marked) |
| heartbeat_interval_s       | THAW_HEARTBEAT_INTERVAL_S    | 5                    |
| worker_lost_after_heartbeats | THAW_WORKER_LOST_AFTER_HEARTBEATS | 3            |
| worker_failure_threshold   | THAW_WORKER_FAILURE_THRESHOLD | 5 (newest calls on a worker all failed: no new calls or replicas until a probe call passes; 0: off) |
| worker_probe_interval_s    | THAW_WORKER_PROBE_INTERVAL_S | 30 (between probe calls to such a worker) |
| replica_answer_timeout_s   | THAW_REPLICA_ANSWER_TIMEOUT_S | 10 (a replica asked, on a call's cancel, whether it still answers is killed when it does not within this) |
| reconcile_interval_s       | THAW_RECONCILE_INTERVAL_S    | 0.5 (for the whole server: each of N processes reconciles every N intervals) |
| result_poll_interval_s     | THAW_RESULT_POLL_INTERVAL_S  | 0.25 (other processes' results) |
| deploy_validate_timeout_s  | THAW_DEPLOY_VALIDATE_TIMEOUT_S | 120                |
| replica_start_timeout_s    | THAW_REPLICA_START_TIMEOUT_S | 900 (then the start counts as failed) |
| direct_calls               | THAW_DIRECT_CALLS            | true (warm sync calls go straight to the worker's data port) |
| scale_up_window_s          | THAW_SCALE_UP_WINDOW_S       | 0 (scale up to the lowest recommendation of this window) |
| scale_down_window_s        | THAW_SCALE_DOWN_WINDOW_S     | 60 (scale down to the highest recommendation of this window) |
| worker_name                | THAW_WORKER_NAME             | <host name>-<first 6 of the worker id> (unique per worker; a name a live worker has is refused) |
| worker_dir                 | THAW_WORKER_DIR              | <home>/worker (id, code bundles; one per agent) |
| worker_concurrency         | THAW_WORKER_CONCURRENCY      | 32 (Celery threads: calls + starts at once) |
| drain_grace_s              | THAW_DRAIN_GRACE_S           | 30 (on SIGTERM/Ctrl-C a worker takes no new calls and lets running ones finish this long, then stops its replicas) |
| worker_data_host           | THAW_WORKER_DATA_HOST        | 127.0.0.1 (the direct call port's address; empty: off) |
| worker_data_port           | THAW_WORKER_DATA_PORT        | 0 (any free port)    |
| worker_data_advertise_host | THAW_WORKER_DATA_ADVERTISE_HOST | (the listening host; what the control plane dials) |
| worker_pool_size           | THAW_WORKER_POOL_SIZE        | 1 (pre-warmed generic replica processes per device) |
| worker_pool_preload        | THAW_WORKER_POOL_PRELOAD     | transformers,peft (imported by every generic replica process) |
| worker_pool_zygote         | THAW_WORKER_POOL_ZYGOTE      | true (generic processes are forks of one that imported them) |
| worker_pool_host_bytes_max | THAW_WORKER_POOL_HOST_BYTES_MAX | 8 GiB (host memory a pooled CPU process populates for its weights; 0: off) |
| worker_pool_refill_delay_s | THAW_WORKER_POOL_REFILL_DELAY_S | 1.0 (after a pool hit, before the pool refills) |
| adapter_cache_size         | THAW_ADAPTER_CACHE_SIZE      | 8 (adapters a replica loads on first use and keeps, LRU) |
| worker_cpu_threads         | THAW_WORKER_CPU_THREADS      | 0 (torch threads of a CPU replica, at most a container's `cpus`; 0: the worker's cores less one, left to the agent and the serving path) |
| docker_url                 | THAW_DOCKER_URL              | unix:///var/run/docker.sock |
| docker_warm_size           | THAW_DOCKER_WARM_SIZE        | 0 (warm containers per image) |
| otlp_endpoint              | THAW_OTLP_ENDPOINT           | (none: no traces; OTLP/HTTP base URL, e.g. http://collector:4318) |
| trace_slow_threshold_ms    | THAW_TRACE_SLOW_THRESHOLD_MS | 1000 (calls this slow are always traced) |
| trace_sample_ratio         | THAW_TRACE_SAMPLE_RATIO      | 0.01 (share of other calls traced; errors always are) |

Settings are read once per process, at its entry point, and passed down.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from snapshotter.config import CacheConfig, LoaderConfig, RamTierConfig, S3Config, StoreConfig

# Where the host-RAM tier lives by default: a tmpfs, shared by the worker's processes.
_SHM_DIR = Path("/dev/shm")
_RAM_TIER_DEFAULT_FRACTION = 0.25


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="THAW_", extra="ignore")

    home: Path = Path(".thaw")
    store: str | None = Field(default=None, description="directory or s3://bucket/prefix")
    s3_endpoint_url: str | None = None
    s3_region: str = "us-east-1"
    s3_access_key_id: str | None = None
    s3_secret_access_key: str | None = None
    cache_dir: Path | None = None
    cache_max_bytes: int = 64 << 30
    cache_min_free_bytes: int = Field(default=64 << 20, ge=0)
    ram_tier_dir: Path | None = None
    ram_tier_max_bytes: int | None = Field(default=None, ge=0)
    ram_tier_verify: bool = True
    ram_tier_pin_ahead: bool = True
    chunk_size_bytes: int = 8 << 20
    loader_max_inflight_bytes: int = 256 << 20
    loader_fetch_threads: int = 16
    loader_decode_threads: int = 4
    loader_map_cache: bool = True
    lease_ttl_s: float = Field(default=120.0, ge=0)
    gc_grace_s: float = Field(default=3600.0, ge=0)
    # --- control plane (see control_plane/) ---
    database_url: str | None = None
    broker_url: str | None = None
    broker_poll_interval_s: float = 0.02
    server_url: str = "http://127.0.0.1:8420"
    api_key: str | None = None
    server_host: str = "127.0.0.1"
    server_port: int = 8420
    server_processes: int = Field(default=1, ge=1)
    peer_dir: Path | None = None
    admin_key_file: Path | None = None
    auth_cache_ttl_s: float = Field(default=2.0, ge=0)
    # Fernet key of function secrets at rest (services.secrets); None: <home>/secrets.key.
    secrets_key: str | None = Field(default=None, repr=False)
    max_body_bytes: int = 6 << 20
    # At most 200: pydantic stops serializing at about 250 levels, and a call's input
    # travels nested a few levels deeper in its messages and results.
    max_body_depth: int = Field(default=64, ge=1, le=200)
    max_upload_bytes: int = 64 << 30
    # Under max_body_bytes: the worker posts a result to the control plane in one body.
    max_result_bytes: int = Field(default=4 << 20, ge=1)
    max_stream_chunk_bytes: int = Field(default=1 << 20, ge=1)
    max_error_bytes: int = Field(default=64 << 10, ge=256)
    max_log_bytes_per_call: int = Field(default=1 << 20, ge=1)
    heartbeat_interval_s: float = 5.0
    worker_lost_after_heartbeats: int = 3
    worker_failure_threshold: int = Field(default=5, ge=0)
    worker_probe_interval_s: float = Field(default=30.0, gt=0)
    replica_answer_timeout_s: float = Field(default=10.0, gt=0)
    reconcile_interval_s: float = 0.5
    result_poll_interval_s: float = 0.25
    deploy_validate_timeout_s: float = 120.0
    replica_start_timeout_s: float = 900.0
    direct_calls: bool = True
    scale_up_window_s: float = Field(default=0.0, ge=0)
    scale_down_window_s: float = Field(default=60.0, ge=0)
    # --- worker agent (see worker/) ---
    worker_name: str | None = None
    worker_dir: Path | None = None
    worker_concurrency: int = Field(default=32, ge=1)
    drain_grace_s: float = Field(default=30.0, ge=0)
    worker_data_host: str = "127.0.0.1"
    worker_data_port: int = Field(default=0, ge=0, le=65535)
    worker_data_advertise_host: str | None = None
    worker_pool_size: int = Field(default=1, ge=0)
    worker_pool_preload: str = "transformers,peft"
    worker_pool_zygote: bool = True
    worker_pool_host_bytes_max: int = Field(default=8 << 30, ge=0)
    worker_pool_refill_delay_s: float = Field(default=1.0, ge=0)
    adapter_cache_size: int = Field(default=8, ge=0)
    worker_cpu_threads: int = Field(default=0, ge=0)
    docker_url: str = "unix:///var/run/docker.sock"
    docker_warm_size: int = Field(default=0, ge=0)
    # --- traces (see control_plane/tracing.py) ---
    otlp_endpoint: str | None = None
    trace_slow_threshold_ms: float = Field(default=1000.0, ge=0)
    trace_sample_ratio: float = Field(default=0.01, ge=0, le=1)

    def store_config(self, override: str | None = None) -> StoreConfig:
        url = override or self.store or str(self.home / "store")
        s3 = S3Config(
            endpoint_url=self.s3_endpoint_url,
            region=self.s3_region,
            access_key_id=self.s3_access_key_id,
            secret_access_key=self.s3_secret_access_key,
        )
        return StoreConfig(url=url, s3=s3)

    def database_url_resolved(self) -> str:
        """The SQLAlchemy URL; embedded default: SQLite under ``home``."""
        return self.database_url or f"sqlite:///{(self.home / 'thaw.db').resolve()}"

    def broker_url_resolved(self) -> str:
        """Celery's broker; embedded default: kombu's ``filesystem://`` (no server)."""
        return self.broker_url or "filesystem://"

    def broker_folder(self) -> Path:
        """Where the ``filesystem://`` transport keeps its messages."""
        return self.home / "broker"

    def cache_config(self) -> CacheConfig:
        return CacheConfig(
            directory=self.cache_dir or self.home / "cache", max_bytes=self.cache_max_bytes
        )

    def ram_tier_config(self) -> RamTierConfig:
        """The host-RAM tier; every process with the same home shares the default one.

        Who removes the directory:

        - the default (``/dev/shm/thaw-<home hash>``, or ``<home>/ram-tier`` without
          ``/dev/shm``) is thaw's: the workers of this home share it, and the last
          one to stop removes it, so a stopped installation holds no RAM. A worker
          killed before it could (SIGKILL, a crash) leaves it to the next worker of
          the home. To keep the weights across worker restarts, set ``ram_tier_dir``.
        - ``ram_tier_dir`` set is the user's: no worker removes it, however many
          workers share it or stop.
        """
        directory = self.ram_tier_dir
        chosen_by_thaw = directory is None
        if directory is None:
            home_hash = hashlib.sha256(str(self.home.resolve()).encode()).hexdigest()[:12]
            shm = _SHM_DIR if _SHM_DIR.is_dir() else None
            directory = shm / f"thaw-{home_hash}" if shm else self.home / "ram-tier"
        max_bytes = self.ram_tier_max_bytes
        if max_bytes is None:
            phys_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            max_bytes = int(phys_bytes * _RAM_TIER_DEFAULT_FRACTION)
        return RamTierConfig(
            directory=directory,
            max_bytes=max_bytes,
            verify=self.ram_tier_verify,
            pin_ahead=self.ram_tier_pin_ahead,
            remove_when_unused=chosen_by_thaw,
        )

    def loader_config(self) -> LoaderConfig:
        return LoaderConfig(
            chunk_size_bytes=self.chunk_size_bytes,
            max_inflight_bytes=self.loader_max_inflight_bytes,
            fetch_threads=self.loader_fetch_threads,
            decode_threads=self.loader_decode_threads,
            map_cache=self.loader_map_cache,
            lease_ttl_s=self.lease_ttl_s,
        )
