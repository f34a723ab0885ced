"""What the worker tells the scheduler it holds, per tier, and how fast each tier reads.

- Disk cache: a manifest's held bytes are its tensor-data bytes whose chunks
  are in the cache; it counts as cached (``cached_manifests``) when all are.
  Headers and small files are read from the store directly and not counted.
- Host-RAM tier: every manifest it holds, all of its tensor bytes (an entry
  is all of a manifest or none of it).
- Bandwidths: the RAM tier's shared read average; disk and store from the
  recent loads replicas reported (``BandwidthMeter``), each a moving average
  over loads that one tier served almost entirely.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

from control_plane.protocol import TierBandwidths, TierHolding
from snapshotter.cache import DiskCache
from snapshotter.config import CacheConfig
from snapshotter.errors import SnapshotterError
from snapshotter.manifest import Manifest
from snapshotter.ram_tier import RamTier
from snapshotter.registry import Registry
from worker.child_protocol import LoadStats

# A load counts toward a tier's bandwidth when that tier served this share of it.
SINGLE_TIER_SHARE = 0.9
# Weight of the newest load in a tier's moving average.
BANDWIDTH_NEW_WEIGHT = 0.3
# Loads shorter than this say more about overheads than about bandwidth.
MIN_LOAD_S = 0.001


@dataclass(frozen=True)
class InventoryReport:
    cached_manifests: list[str]  # fully in the disk cache
    cache_bytes: int
    holdings: list[TierHolding]
    ram_read_bytes_per_s: float | None


def tensor_data_chunks(manifest: Manifest) -> dict[str, int]:
    """Digest -> raw size of the chunks holding the manifest's tensor bytes."""
    out: dict[str, int] = {}
    for f in manifest.safetensors_files():
        data_offset = f.safetensors.data_offset if f.safetensors else 0
        out.update((c.digest, c.size) for c in f.chunks if c.offset >= data_offset)
    return out


def held_tensor_bytes(manifest: Manifest, held: frozenset[str]) -> tuple[int, int]:
    """(tensor-data bytes among ``held`` chunks, all tensor-data bytes), distinct chunks."""
    chunks = tensor_data_chunks(manifest)
    return sum(size for d, size in chunks.items() if d in held), sum(chunks.values())


def load_bandwidth(load: LoadStats) -> tuple[str, float] | None:
    """("disk" | "store", bytes/s) for a load one of them served, else None.

    RAM-tier loads are measured by the tier itself; mixed loads say nothing
    clean about either tier.
    """
    if load.seconds < MIN_LOAD_S or load.tensor_bytes <= 0:
        return None
    for tier, nbytes in (("disk", load.cache_bytes), ("store", load.store_bytes)):
        if nbytes >= SINGLE_TIER_SHARE * load.tensor_bytes:
            return tier, load.tensor_bytes / load.seconds
    return None


@dataclass
class BandwidthMeter:
    """Moving averages of disk-cache and store bandwidth from replicas' loads."""

    bytes_per_s: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def observe(self, loads: Iterable[LoadStats]) -> None:
        for load in loads:
            measured = load_bandwidth(load)
            if measured is None:
                continue
            tier, rate = measured
            with self._lock:
                old = self.bytes_per_s.get(tier)
                self.bytes_per_s[tier] = (
                    rate if old is None else old + BANDWIDTH_NEW_WEIGHT * (rate - old)
                )

    def get(self, tier: str) -> float | None:
        with self._lock:
            return self.bytes_per_s.get(tier)


class CacheInventory:
    """Reads the disk cache and RAM tier the replica processes fill, for heartbeats.

    The cache index is rebuilt from the directory at most every
    ``refresh_every`` snapshots (replicas write to it from other processes).
    """

    def __init__(
        self,
        config: CacheConfig,
        registry: Registry | None,
        refresh_every: int = 5,
        *,
        ram_tier: RamTier | None = None,
    ) -> None:
        self.cache = DiskCache(config)
        self.registry = registry
        self.ram_tier = ram_tier
        self.refresh_every = refresh_every
        self._manifests: dict[str, Manifest] = {}
        self._count = 0
        self._lock = threading.Lock()

    def snapshot(self, candidates: set[str]) -> tuple[list[str], int]:
        """(manifest digests among ``candidates`` fully in the disk cache, cache bytes)."""
        report = self.report(candidates)
        return report.cached_manifests, report.cache_bytes

    def report(self, candidates: set[str]) -> InventoryReport:
        """Holdings of ``candidates`` (and of whatever the RAM tier holds) per tier."""
        ram = self.ram_tier.inventory() if self.ram_tier is not None else None
        ram_held = dict(ram.manifests) if ram is not None else {}
        holdings = [TierHolding(tier="ram", digest=d, bytes=n) for d, n in sorted(ram_held.items())]
        with self._lock:
            self._count += 1
            if self._count % self.refresh_every == 1 or self.refresh_every <= 1:
                self.cache.refresh()
            held = self.cache.inventory().digests
            cached = []
            for digest in sorted(set(candidates) | set(ram_held)):
                manifest = self._manifest(digest)
                if manifest is None:
                    continue
                have, total = held_tensor_bytes(manifest, held)
                if have > 0:
                    holdings.append(TierHolding(tier="disk", digest=digest, bytes=have))
                if have == total and digest in candidates:
                    cached.append(digest)
            cache_bytes = self.cache.total_bytes
        rate = ram.read_bytes_per_s if ram is not None else None
        return InventoryReport(cached, cache_bytes, holdings, rate)

    def _manifest(self, digest: str) -> Manifest | None:
        if digest not in self._manifests and self.registry is not None:
            try:
                self._manifests[digest] = self.registry.get_manifest(digest)
            except SnapshotterError:
                return None
        return self._manifests.get(digest)


def bandwidths(report: InventoryReport, meter: BandwidthMeter) -> TierBandwidths:
    """The heartbeat's measured bandwidths (None where nothing was measured yet)."""
    return TierBandwidths(
        ram_bytes_per_s=_positive(report.ram_read_bytes_per_s),
        disk_bytes_per_s=_positive(meter.get("disk")),
        store_bytes_per_s=_positive(meter.get("store")),
    )


def _positive(rate: float | None) -> float | None:
    return rate if rate is not None and rate > 0 else None
