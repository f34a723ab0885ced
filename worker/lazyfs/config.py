"""What a mount process is told (JSON on its command line) and what it answers.

Control protocol: the mount process listens on ``control_socket`` (Unix,
one request per connection, frames from ``worker.frames``)::

    {"op": "ping"}                 → {"ok": true}
    {"op": "stats"}                → {"ok": true, "stats": MountStats}
    {"op": "save_profile"}         → {"ok": true, "order": [...]}   stop recording;
                                     store the order as the image's prefetch profile
    {"op": "wait_prefetch", "timeout_s": 30} → {"ok": true, "done": bool}

Anything else, or a failure, answers ``{"ok": false, "error": "..."}``.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from snapshotter.config import CacheConfig, S3Config, StoreConfig
from worker.lazyfs.content import DEFAULT_MEMORY_BYTES


class MountConfig(BaseModel):
    mountpoint: str
    image_digest: str = Field(pattern=r"^blake3:[0-9a-f]{64}$")
    control_socket: str
    store_url: str
    s3_endpoint_url: str | None = None
    s3_region: str | None = None
    s3_access_key_id: str | None = None
    s3_secret_access_key: str | None = None
    cache_dir: str
    cache_max_bytes: int = 64 << 30
    extra_dirs: list[str] = Field(default_factory=list)
    extra_files: list[str] = Field(default_factory=list)
    record_profile: bool = True
    prefetch: bool = True
    prefetch_threads: int = Field(default=16, ge=1)
    memory_bytes: int = Field(default=DEFAULT_MEMORY_BYTES, ge=0)

    def store_config(self) -> StoreConfig:
        s3 = S3Config(
            endpoint_url=self.s3_endpoint_url,
            region=self.s3_region,
            access_key_id=self.s3_access_key_id,
            secret_access_key=self.s3_secret_access_key,
        )
        return StoreConfig(url=self.store_url, s3=s3)

    def cache_config(self) -> CacheConfig:
        from pathlib import Path

        return CacheConfig(directory=Path(self.cache_dir), max_bytes=self.cache_max_bytes)

    @classmethod
    def for_store(cls, store: StoreConfig, cache: CacheConfig, **fields: object) -> MountConfig:
        """Build from the snapshotter's plain configs plus mount-specific fields."""
        return cls.model_validate(
            {
                "store_url": store.url,
                "s3_endpoint_url": store.s3.endpoint_url,
                "s3_region": store.s3.region,
                "s3_access_key_id": store.s3.access_key_id,
                "s3_secret_access_key": store.s3.secret_access_key,
                "cache_dir": str(cache.directory),
                "cache_max_bytes": cache.max_bytes,
                **fields,
            }
        )


class MountStats(BaseModel):
    """Counters since the mount started. ``store_bytes`` are stored (framed) bytes fetched."""

    store_gets: int
    store_bytes: int
    cache_hits: int
    cache_hit_bytes: int
    files_read: int
    bytes_served: int
    chunks_fetched: int
    profile_length: int
    prefetch_started: list[str]
    prefetch_done: bool
    prefetch_errors: list[str]
