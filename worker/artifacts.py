"""The replica child's access to artifacts: code bundles, model files, weights.

Everything comes from the snapshotter by manifest digest:

- ``materialize`` writes a manifest's files (all, or only the non-tensor
  ones) into a directory named by the digest, atomically: a half-written
  directory is never visible, and a second replica of the same digest
  reuses the first one's directory.
- ``load_weights`` streams a manifest's tensors onto a device through the
  snapshotter's loader and reports how long fetching and placing took.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from snapshotter.config import CacheConfig, LoaderConfig, RamTierConfig, S3Config, StoreConfig
from snapshotter.digest import digest_bytes, hex_part
from snapshotter.errors import IntegrityError
from snapshotter.json_doc import parse_json_object
from snapshotter.manifest import FileEntry, Manifest
from snapshotter.pull import fetch_chunk
from snapshotter.registry import Registry
from worker.child_protocol import LoadStats, StoreSpec

TENSOR_SUFFIXES = (".safetensors",)


@dataclass
class LoadedWeights:
    tensors: dict[str, Any]
    phases_ms: dict[str, float] = field(default_factory=dict)


def store_config(spec: StoreSpec) -> StoreConfig:
    s3 = S3Config(
        endpoint_url=spec.s3_endpoint_url,
        region=spec.s3_region,
        access_key_id=spec.s3_access_key_id,
        secret_access_key=spec.s3_secret_access_key,
    )
    return StoreConfig(url=spec.url, s3=s3)


def cache_config(spec: StoreSpec) -> CacheConfig:
    return CacheConfig(directory=Path(spec.cache_dir), max_bytes=spec.cache_max_bytes)


def loader_config(spec: StoreSpec) -> LoaderConfig:
    return LoaderConfig(
        chunk_size_bytes=spec.chunk_size_bytes,
        max_inflight_bytes=spec.loader_max_inflight_bytes,
        fetch_threads=spec.loader_fetch_threads,
        decode_threads=spec.loader_decode_threads,
        lease_ttl_s=spec.loader_lease_ttl_s,
        map_cache=spec.loader_map_cache,
    )


def ram_tier_config(spec: StoreSpec) -> RamTierConfig | None:
    """The worker's host-RAM tier, or None when it has none (no directory, or capped at 0)."""
    if not spec.ram_tier_dir or spec.ram_tier_max_bytes <= 0:
        return None
    return RamTierConfig(
        directory=Path(spec.ram_tier_dir),
        max_bytes=spec.ram_tier_max_bytes,
        verify=spec.ram_tier_verify,
        pin_ahead=spec.ram_tier_pin_ahead,
    )


def open_registry(spec: StoreSpec) -> Registry:
    from snapshotter.stores import open_store

    return Registry(open_store(store_config(spec)))


def is_tensor_file(path: str) -> bool:
    return path.endswith(TENSOR_SUFFIXES)


def read_file(registry: Registry, entry: FileEntry) -> bytes:
    """A file's bytes, every chunk and the whole file verified against digests."""
    data = b"".join(fetch_chunk(registry, chunk, entry.path) for chunk in entry.chunks)
    if digest_bytes(data) != entry.digest:
        raise IntegrityError(f"file {entry.path} does not match its digest {entry.digest}")
    return data


def materialize(
    registry: Registry, digest: str, root: Path, *, include_tensors: bool = False
) -> Path:
    """Write the manifest's files under ``root/<hex>[-files]``; return that directory.

    Idempotent and safe against concurrent callers: the directory is built
    under a temporary name and renamed into place; the loser of a race
    discards its copy.
    """
    dest = root / (hex_part(digest) + ("" if include_tensors else "-files"))
    if dest.is_dir():
        return dest
    root.mkdir(parents=True, exist_ok=True)
    manifest = registry.get_manifest(digest)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    try:
        for entry in manifest.files:
            if not include_tensors and is_tensor_file(entry.path):
                continue
            _write_entry(registry, entry, tmp)
        try:
            os.rename(tmp, dest)
        except OSError:
            if not dest.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _write_entry(registry: Registry, entry: FileEntry, root: Path) -> None:
    target = (root / entry.path).resolve()
    if not target.is_relative_to(root.resolve()):
        raise IntegrityError(f"manifest file path {entry.path!r} escapes its directory")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(read_file(registry, entry))
    os.chmod(target, entry.mode & 0o755)


def read_json_file(registry: Registry, manifest: Manifest, path: str) -> dict[str, Any]:
    """A small JSON file of a manifest (``config.json``), or ``{}`` when absent."""
    try:
        entry = manifest.file(path)
    except KeyError:
        return {}
    return parse_json_object(read_file(registry, entry), path, error=IntegrityError)


class WeightLoader:
    """Streams manifests' tensors onto a device; one per replica, reused for adapters.

    Loads go through the worker's host-RAM tier when the spec names one, then
    the disk cache, then the store. ``loads`` records every load's tier bytes.
    """

    def __init__(self, registry: Registry, spec: StoreSpec) -> None:
        from snapshotter import DiskCache, Snapshotter
        from snapshotter.ram_tier import RamTier

        tier_config = ram_tier_config(spec)
        self.spec = spec
        self.registry = registry
        self.snapshotter = Snapshotter(
            registry,
            DiskCache(cache_config(spec)),
            loader_config(spec),
            ram_tier=RamTier(tier_config) if tier_config is not None else None,
        )
        self.loads: list[LoadStats] = []

    def refresh_cache_index(self) -> None:
        """Re-read the disk cache's index: other processes may have filled it since this
        loader was built (a pooled process's loader is built long before its load)."""
        cache = self.snapshotter.source.cache
        if cache is not None:
            cache.refresh()

    def prewarm(self, device: str, host_bytes: int = 0) -> None:
        """Allocate the staging buffers for ``device`` now: pinned ones for CUDA,
        ``host_bytes`` of populated memory for the CPU (``Snapshotter.prewarm``)."""
        self.snapshotter.prewarm(device, host_bytes)

    def give_back_host_memory(self) -> int:
        return self.snapshotter.give_back_host_memory()

    def load(self, digest: str, device: str) -> LoadedWeights:
        """Every tensor of the manifest on ``device``, with fetch and to-device times."""
        tensors = self.snapshotter.load(digest, device)
        self.loads.append(load_stats(tensors.report))
        return LoadedWeights(tensors, weights_phases(tensors.report))


def load_stats(report: Any) -> LoadStats:
    """The agent's view of one ``snapshotter.LoadReport``."""
    return LoadStats(
        digest=report.manifest_digest,
        tensor_bytes=report.tensor_bytes,
        ram_bytes=report.ram_tier_bytes,
        cache_bytes=report.cache_hit_bytes,
        store_bytes=report.store_bytes,
        cache_hits=report.cache_hits,
        store_gets=report.store_gets,
        seconds=max(0.0, report.wall_s - report.setup_s),
        prefaulted_bytes=report.prefaulted_bytes,
        arena_bytes=0 if report.ram_tier_bytes else report.arena_bytes,
    )


def weights_phases(report: Any) -> dict[str, float]:
    """Split the load's wall time into ``weights_fetch`` and ``weights_to_device``.

    The loader overlaps its stages, so their busy times add up to more than
    the wall time; the wall time (after setup, which counts as fetch) is
    split in proportion to fetch + verify/decompress versus placement.
    """
    busy_fetch_s = report.fetch.seconds + report.verify_decompress.seconds
    busy_place_s = report.place.seconds
    pipelined_s = max(0.0, report.wall_s - report.setup_s)
    share = busy_place_s / (busy_fetch_s + busy_place_s) if busy_fetch_s + busy_place_s else 0.0
    to_device_ms = pipelined_s * share * 1000
    return {"weights_fetch": report.wall_s * 1000 - to_device_ms, "weights_to_device": to_device_ms}
