"""Re-check a worker's tiers with the content digests: ``thaw cache verify``.

A load checks bytes from the disk cache or the RAM tier against the checksum
the tier recorded when it wrote them (``snapshotter.digest``): cheap, and
enough to catch a byte flipped or lost on the node. This re-hashes what the
tiers hold with blake3 against the digests that name the content::

    disk cache  every entry, decoded     == the chunk digest its file is named by
                                            and == the checksum its header records
    RAM tier    manifest.json            == the manifest digest its entry is named by
                every data file          == the checksum its meta.json records
                each chunk's bytes in it == the chunk digest the manifest gives

A damaged entry is dropped (the next load fetches those bytes again and
writes them back). A sound entry from an older thaw, which recorded no
checksum, gets one in the RAM tier; in the disk cache it is left as it is and
counted: the next load that reads it records it, because only a load knows
where in a page its bytes go, and so writes it to be mapped, not read
(``cache_entry.payload_offset``). Entries are read while loads go on beside it:
an entry evicted meanwhile is skipped, and a dropped one is only a future miss.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from snapshotter import cache_entry, codec
from snapshotter.cache import DiskCache
from snapshotter.digest import checksum_bytes, digest_bytes
from snapshotter.errors import SnapshotterError
from snapshotter.load_plan import plan_load
from snapshotter.manifest import Manifest
from snapshotter.ram_tier import RamTier
from snapshotter.ram_tier_entry import BadEntry, bytes_view, check_files, map_all, read_meta

# A cache entry claiming more than this is damaged, not a buffer to allocate.
_MAX_CHUNK_BYTES = 1 << 30

Progress = Callable[[int], None]  # bytes checked since the last call


@dataclass(frozen=True)
class Damaged:
    digest: str  # the chunk's (disk cache) or the manifest's (RAM tier)
    reason: str


@dataclass
class TierCheck:
    """One tier's verification: what was read, what was dropped, what was recorded."""

    tier: str  # "disk cache" | "RAM tier"
    entries: int = 0
    bytes_checked: int = 0
    recorded: int = 0  # older entries that now record their checksums
    older: int = 0  # older disk-cache entries, sound, left for a load to record
    damaged: list[Damaged] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.damaged


def verify_cache(cache: DiskCache, progress: Progress = lambda n: None) -> TierCheck:
    """Every disk-cache entry against its digest; damaged ones dropped."""
    check = TierCheck("disk cache")
    for digest, entry in sorted(cache.entries().items()):
        try:
            data = cache.path(digest).read_bytes()
        except FileNotFoundError:  # evicted meanwhile
            progress(entry.size_bytes)
            continue
        reason = _check_cache_entry(cache, digest, data, check)
        check.entries += 1
        check.bytes_checked += len(data)
        progress(entry.size_bytes)
        if reason is not None:
            check.damaged.append(Damaged(digest, reason))
            cache.drop(digest)
    return check


def _check_cache_entry(cache: DiskCache, digest: str, data: bytes, check: TierCheck) -> str | None:
    """Why the entry is damaged, or None; counts a sound older entry."""
    raw_size = codec.HEADER.unpack_from(data)[2] if len(data) >= codec.HEADER_SIZE else 0
    if raw_size > _MAX_CHUNK_BYTES:
        return f"its header claims {raw_size} bytes"
    raw = memoryview(bytearray(raw_size))
    try:
        header = cache_entry.decode_into(data, raw)
    except SnapshotterError as exc:
        return str(exc)
    if digest_bytes(raw) != digest:
        return "its bytes do not match the digest"
    if header.checksum is None:
        check.older += 1
    elif checksum_bytes(raw) != header.checksum:
        return "its recorded checksum is wrong"
    return None


def verify_tier(tier: RamTier, progress: Progress = lambda n: None) -> TierCheck:
    """Every RAM-tier entry against its manifest's digests; damaged ones dropped."""
    check = TierCheck("RAM tier")
    for manifest_digest, size_bytes in sorted(tier.inventory().manifests.items()):
        try:
            reason = _check_tier_entry(tier, manifest_digest, progress, check)
        except _Vanished:
            continue
        check.entries += 1
        check.bytes_checked += size_bytes
        if reason is not None:
            check.damaged.append(Damaged(manifest_digest, reason))
            tier.drop(manifest_digest)
    return check


class _Vanished(Exception):
    """The entry was evicted while it was being checked."""


def _check_tier_entry(
    tier: RamTier, manifest_digest: str, progress: Progress, check: TierCheck
) -> str | None:
    entry = tier.entry_dir(manifest_digest)
    manifest_json = tier.get_manifest(manifest_digest)
    if manifest_json is None:
        return "its manifest.json is missing or does not match the manifest digest"
    plan = plan_load(Manifest.from_json(manifest_json))
    try:
        meta = read_meta(entry)
        if meta is None:
            raise _Vanished
        if [(f.path, f.data_bytes) for f in meta] != [(f.path, f.data_bytes) for f in plan.files]:
            return "its files differ from the manifest's"
        buffers = map_all(entry, meta)
        if buffers is None:
            raise _Vanished
        checked = check_files(meta, buffers)
    except BadEntry as exc:
        return str(exc)
    views = [bytes_view(b) for b in buffers]
    for work in plan.work:
        for p in work.placements:
            if p.nbytes != work.chunk.size:
                continue  # a chunk straddling header and data: its checksum covers it
            if digest_bytes(views[p.file_idx][p.dest_begin : p.dest_begin + p.nbytes]) != (
                work.chunk.digest
            ):
                return f"{meta[p.file_idx].path} does not match chunk {work.chunk.digest}"
            progress(p.nbytes)
    if checked != meta:
        tier.record_checksums(manifest_digest, meta, checked)
        check.recorded += 1
    return None
