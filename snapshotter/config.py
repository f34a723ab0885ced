"""Plain configuration the snapshotter is given; it never reads the environment.

The process's settings class (``control_plane.settings.Settings``) builds these.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from snapshotter.manifest import DEFAULT_CHUNK_SIZE_BYTES


@dataclass(frozen=True)
class S3Config:
    endpoint_url: str | None = None
    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    max_pool_connections: int = 64


@dataclass(frozen=True)
class StoreConfig:
    """Where artifacts live: a directory, or ``s3://bucket/prefix``."""

    url: str
    s3: S3Config = S3Config()


@dataclass(frozen=True)
class CacheConfig:
    """The worker's disk chunk cache."""

    directory: Path
    max_bytes: int = 64 << 30


@dataclass(frozen=True)
class LoaderConfig:
    """``lease_ttl_s > 0``: a load holds a lease on its manifest in the store while it
    reads chunks, so a concurrent ``thaw gc`` keeps them (``snapshotter.leases``).
    ``map_cache``: a CPU load maps the disk cache's page-cache pages into its buffers
    (copy-on-write) instead of copying them, where an entry's layout allows
    (``snapshotter.cache``); off, every hit is read."""

    chunk_size_bytes: int = DEFAULT_CHUNK_SIZE_BYTES
    max_inflight_bytes: int = 256 << 20
    fetch_threads: int = 16
    decode_threads: int = 4
    map_cache: bool = True
    lease_ttl_s: float = 0.0


@dataclass(frozen=True)
class RamTierConfig:
    """The worker's host-RAM tier of recently used weights (``snapshotter.ram_tier``).

    ``directory`` should be on a tmpfs (``/dev/shm/...``) so entries live in RAM
    and every process on the worker shares them; ``max_bytes`` caps the bytes
    held (0 disables the tier); ``verify`` checks an entry's bytes on every read
    against the checksums recorded when it was written. ``remove_when_unused``:
    the directory belongs to the workers using it, and the last one to stop
    removes it (``snapshotter.ram_tier_users``); off, nothing of thaw removes it.
    ``pin_ahead``: a process prewarmed for CUDA maps the tier's entries and registers
    them as pinned memory while it waits, so its load copies with no registration
    (``snapshotter.loader_pinned``).
    """

    directory: Path
    max_bytes: int = 8 << 30
    verify: bool = True
    remove_when_unused: bool = False
    pin_ahead: bool = True
