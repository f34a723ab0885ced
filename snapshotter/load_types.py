"""What a load returns: the tensors and the report of how they came (shared by the loader,
``snapshotter.module_fill`` and ``snapshotter.profile``, which import only this); and
the pieces a RAM-tier hit is checked and copied by (shared by ``loader_ram`` and
``loader_cuda``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

# Per host buffer, the [begin, end) byte ranges it is checked and copied by.
Pieces = Sequence[Sequence[tuple[int, int]]]
# (buffer index, begin, end): prepare and check those host bytes before they are used
# (populate them, compare their checksum); raises to stop the load.
PieceCheck = Callable[[int, int, int], None]


@dataclass(frozen=True)
class StageReport:
    """One stage: bytes it handled and thread-busy seconds summed over chunks."""

    bytes: int
    seconds: float


@dataclass(frozen=True)
class LoadReport:
    ref: str
    manifest_digest: str
    device: str
    tensor_bytes: int
    chunks: int
    fetch: StageReport  # stored bytes from cache or store
    verify_decompress: StageReport  # raw bytes decoded and hashed
    place: StageReport  # raw bytes put in the buffers (CPU: decoded in place; CUDA: H2D copy)
    cache_hit_bytes: int  # bytes read from the disk cache (its entries are raw)
    store_bytes: int  # stored bytes fetched from the store
    cache_hits: int
    store_gets: int
    peak_inflight_bytes: int
    setup_s: float  # resolve, manifest, plan, buffer allocation
    wall_s: float  # whole call
    ram_tier_bytes: int = 0  # tensor bytes mapped from the host-RAM tier (then chunks == 0)
    prefaulted_bytes: int = 0  # buffer bytes carved from prewarmed host memory
    arena_bytes: int = 0  # prewarmed host memory this load's buffers would need
    ram_tier_insert_s: float = 0.0  # copying a fresh load into the RAM tier
    cache_mapped_bytes: int = 0  # of cache_hit_bytes, mapped into the buffers, not copied
    ram_tier_pinned_bytes: int = 0  # of ram_tier_bytes, copied from pages pinned ahead

    @property
    def tier_bytes(self) -> dict[str, int]:
        """Bytes served by each tier: RAM and disk cache raw, store as stored."""
        return {
            "ram": self.ram_tier_bytes,
            "cache": self.cache_hit_bytes,
            "store": self.store_bytes,
        }

    @property
    def gb_per_s(self) -> float:
        """Tensor bytes per wall second, in GB (1e9 bytes) per second."""
        return self.tensor_bytes / self.wall_s / 1e9 if self.wall_s > 0 else 0.0


class LoadedTensors(dict[str, torch.Tensor]):
    """name -> tensor, with the load's ``report`` and ``manifest_digest``."""

    report: LoadReport
    manifest_digest: str
