"""What the worker tells the scheduler it holds: models whose weights are all cached.

A manifest counts as cached when every chunk of its tensor data is in the
disk cache: those are what a load reads through the cache. (Headers and
small files are read from the store directly and are not counted.)
"""

from __future__ import annotations

import threading

from snapshotter.cache import DiskCache
from snapshotter.config import CacheConfig
from snapshotter.errors import SnapshotterError
from snapshotter.manifest import Manifest
from snapshotter.registry import Registry


class CacheInventory:
    """Reads the disk cache the replica processes fill, for heartbeats.

    The cache index is rebuilt from the directory at most every
    ``refresh_every`` snapshots (replicas write to it from other processes).
    """

    def __init__(
        self, config: CacheConfig, registry: Registry | None, refresh_every: int = 5
    ) -> None:
        self.cache = DiskCache(config)
        self.registry = registry
        self.refresh_every = refresh_every
        self._manifests: dict[str, Manifest] = {}
        self._count = 0
        self._lock = threading.Lock()

    def snapshot(self, candidates: set[str]) -> tuple[list[str], int]:
        """(manifest digests among ``candidates`` fully in the cache, cache bytes)."""
        with self._lock:
            self._count += 1
            if self._count % self.refresh_every == 1 or self.refresh_every <= 1:
                self.cache.refresh()
            held = self.cache.inventory().digests
            cached = [d for d in sorted(candidates) if self._fully_cached(d, held)]
            return cached, self.cache.total_bytes

    def _fully_cached(self, digest: str, held: frozenset[str]) -> bool:
        manifest = self._manifest(digest)
        return manifest is not None and all(c in held for c in tensor_data_chunks(manifest))

    def _manifest(self, digest: str) -> Manifest | None:
        if digest not in self._manifests and self.registry is not None:
            try:
                self._manifests[digest] = self.registry.get_manifest(digest)
            except SnapshotterError:
                return None
        return self._manifests.get(digest)


def tensor_data_chunks(manifest: Manifest) -> set[str]:
    """Digests of the chunks holding the manifest's tensor bytes."""
    out: set[str] = set()
    for f in manifest.safetensors_files():
        data_offset = f.safetensors.data_offset if f.safetensors else 0
        out.update(c.digest for c in f.chunks if c.offset >= data_offset)
    return out
