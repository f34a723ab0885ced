"""The loader's use of the host-RAM tier (``snapshotter.ram_tier``).

::

    load(ref, device)
      manifest held in the tier?  -- yes -> place_held: map the tier's files,
                                            CPU: populated, every piece checked against
                                                 its recorded checksum, at once; the
                                                 mappings ARE the buffers
                                                 (MAP_PRIVATE: shared, copy-on-write)
                                            CUDA: read-only shared mappings; per piece,
                                                  at once: populate, check, register
                                                  as pinned -> device
                                  -- no  -> the chunk pipeline (disk cache, store), then
                                            keep: copy the verified buffers into the tier;
                                            CPU: hand back the tier's mappings instead of
                                            the private buffers, so replicas share pages

A held load reads no chunk: no disk-cache read, no store request. Its
report has ``chunks == 0`` and ``ram_tier_bytes`` equal to the tensor bytes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from snapshotter.load_plan import LoadPlan
from snapshotter.load_types import PieceCheck, Pieces
from snapshotter.pipeline import StageTotals
from snapshotter.ram_tier import RamTier
from snapshotter.ram_tier_entry import BadEntry, TierFile, bytes_view, check_piece, populate_pages

# (host buffers, their pieces, a check run on each piece before its copy) -> (the same
# bytes on the target device, seconds); the CUDA placer's
# ``snapshotter.loader_cuda.copy_to_device`` with its pool, given by the loader.
ToDevice = Callable[
    [Sequence[torch.Tensor], Pieces, PieceCheck | None], tuple[list[torch.Tensor], float]
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HeldLoad:
    """Buffers on the target device, from the tier; totals in the pipeline's terms."""

    buffers: list[torch.Tensor]
    totals: StageTotals
    total_bytes: int
    wall_s: float


def place_held(
    tier: RamTier,
    digest: str,
    plan: LoadPlan,
    dev: torch.device,
    to_device: ToDevice,
) -> HeldLoad | None:
    """The plan's buffers from the tier on ``dev``, or None when it does not hold them.

    Stage totals: fetch = mapping the files, verify = checking their checksums
    (0 bytes when the tier does not verify), place = the copy to the device (CPU: none).
    To CUDA the checks run piece by piece inside the copy (``ToDevice``), each
    piece copied once it passed: place then counts both, verify none of its time.
    """
    start = time.perf_counter()
    cuda = dev.type == "cuda"
    hit = tier.get(digest, plan.files, read_only=cuda, check=not cuda)
    if hit is None:
        return None
    copy_s = 0.0
    buffers = hit.buffers
    if cuda:
        pieces = [f.pieces() for f in hit.files]
        check = None if hit.checked else _piece_check(hit.files, hit.buffers)
        try:
            buffers, copy_s = to_device(hit.buffers, pieces, check)
        except BadEntry as exc:
            tier.corrupt(digest, str(exc))
            return None
    nbytes = hit.total_bytes
    totals = StageTotals(
        fetch_s=hit.map_s,
        fetch_bytes=nbytes,
        decode_s=hit.verify_s,
        decode_bytes=nbytes if tier.config.verify else 0,
        place_s=copy_s,
        place_bytes=nbytes if cuda else 0,
    )
    wall_s = time.perf_counter() - start
    tier.record_read(nbytes, wall_s)
    return HeldLoad(buffers, totals, nbytes, wall_s)


def _piece_check(files: Sequence[TierFile], buffers: Sequence[torch.Tensor]) -> PieceCheck:
    """Populate a piece of a hit's mappings and check it against its recorded checksum."""
    views = [bytes_view(b) for b in buffers]

    def check(i: int, begin: int, end: int) -> None:
        populate_pages(buffers[i][begin:end], files[i].path)
        check_piece(files[i], views[i], begin, end)

    return check


def keep(
    tier: RamTier,
    digest: str,
    manifest_json: bytes,
    plan: LoadPlan,
    buffers: list[torch.Tensor],
) -> tuple[list[torch.Tensor], float]:
    """Put a verified load's buffers in the tier; returns (buffers to use, seconds).

    On the CPU the returned buffers are the tier's private mappings when the
    tier holds the entry (same bytes; the load's own buffers are then freed,
    so this replica shares pages with the next ones); otherwise ``buffers``.
    """
    start = time.perf_counter()
    try:
        held = tier.put(digest, manifest_json, plan.files, buffers)
    except OSError as exc:  # the tier is an optimization: the load itself succeeded
        log.warning("weights %s not kept in the RAM tier: %s", digest, exc)
        held = False
    if held and all(b.device.type == "cpu" for b in buffers):
        mapped = tier.map(digest, plan.files)
        if mapped is not None:
            buffers = mapped
    return buffers, time.perf_counter() - start
