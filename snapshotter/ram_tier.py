"""The worker's host-RAM tier: the weights of recently used models, shared by its processes.

A replica that starts again on the same worker maps its weights from here
instead of reading the disk cache or the store. Layout under
``RamTierConfig.directory`` (a tmpfs such as ``/dev/shm/thaw-<hash>``, so
entries are RAM and every process on the machine sees them)::

    .lock                        flock: serializes puts, drops and evictions
    bandwidth.json               {"bytes_per_s": ...}: moving average of reads, all processes
    entries/<hex>/meta.json      manifest digest, per file (path, data_bytes, xxh3 per piece)
    entries/<hex>/manifest.json  the manifest's canonical JSON (a re-warm reads no store)
    entries/<hex>/<i>.data       the data region of the manifest's i-th file, byte for byte
                                 the loader's buffer for it (files without tensors: 0 bytes)
    entries/.tmp-*/              an entry being written
    entries/.trash-*/            an entry being removed

``<hex>`` is the manifest digest's hex. An entry is all of a manifest or none
of it: the loader ``put``s every file buffer after a verified load, and a
load ``get``s every buffer or misses.

Contracts:

- A reader never sees a partial entry: an entry is written into a ``.tmp-``
  directory, then renamed into place; removal renames it to ``.trash-`` first.
  Readers take no lock. Data files are read-only (0444) once written.
- ``get`` maps each data file and fills the mapping's page tables in one call
  (``madvise(MADV_POPULATE_READ)``, Linux 5.14+; older kernels fault pages on
  first use), so no fault trickles into the first forward pass. No byte is
  copied: the returned CPU tensors are the tmpfs pages themselves, shared with
  the tier and with every other replica mapping the entry (N replicas of a
  model hold one copy of its weights). The mapping is ``MAP_PRIVATE``: a write
  by the user's function copies the 4 KiB page it touches into memory private
  to that replica (copy-on-write), so it can never corrupt the tier or another
  replica, and costs that replica the pages it wrote. This is what
  ``torch.load(mmap=True)`` does; a read-only mapping would turn such a write
  into a ``SIGSEGV`` that kills the replica with no Python error, since torch
  has no read-only tensors. Not ``MAP_POPULATE``: on a private writable mapping
  it populates for writing, copying every page.
- ``get(read_only=True)`` (a load to CUDA) maps ``MAP_SHARED`` + ``PROT_READ``
  instead: the mappings are only the source of the copy to the device, never
  handed to the function, and can be registered as pinned memory in place
  (``snapshotter.loader_cuda``); pinning a private mapping would break its
  sharing (the kernel gives a long-term pin of a copy-on-write page a copy).
- Huge pages come from the tmpfs: mounted ``huge=within_size`` (or with
  ``shmem_enabled`` ``force``), the tier's files are written in 2 MiB pages and
  the kernel can map them with one entry per 2 MiB; ``/dev/shm`` is usually
  ``huge=never``, then 4 KiB pages.
- Eviction may remove an entry that a replica still maps or reads: on Linux an
  unlinked file stays valid for its open mappings, whose pages are freed when
  the last one goes. So readers are never protected by locks; the cap counts
  linked entries only (a replica holding an evicted model keeps its pages).
- Integrity: the bytes ``put`` are a load's, each chunk verified on its way
  into the node (``snapshotter.source``); ``put`` records the checksum (xxh3)
  of each data region as written. With ``verify`` on, ``get`` checks every
  mapped file against it (at memory speed, no digest) and a mismatch drops
  the entry and misses, so the load falls through to the disk cache and
  re-inserts a good copy. An entry from an older thaw, which recorded blake3
  digests instead, is checked with those once and its checksums recorded.
  ``snapshotter.tier_verify`` re-checks entries against the manifest's digests.
- Space: data files are written with ``write`` (never through a shared
  mapping), so a full tmpfs is ``ENOSPC`` at insert (the insert is skipped,
  the partial entry removed, the load still succeeds), never ``SIGBUS``.
- LRU by bytes under ``max_bytes``: last use is ``meta.json``'s mtime, touched
  by each hit in any process; victims are chosen by the pure
  ``snapshotter.cache.choose_victims``. An artifact larger than the cap is not held.
  Puts (with their evictions) hold the ``.lock`` flock while they write, so two
  processes inserting at once neither overshoot the cap nor write one entry twice.
- Bandwidth: ``bandwidth.json`` is a moving average of (bytes / seconds) of
  loads served from the tier, in any process, for the scheduler's estimates.
  On the CPU a load's seconds are mapping and populating plus (with ``verify``)
  hashing.

The entry's file format and I/O live in ``snapshotter.ram_tier_entry``; the
loader's side (place a hit on the device, keep a fresh load) in
``snapshotter.loader_ram``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import shutil
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from snapshotter.cache import CacheEntry, choose_victims
from snapshotter.config import RamTierConfig
from snapshotter.digest import digest_bytes, hex_part, is_digest
from snapshotter.errors import StoreError
from snapshotter.manifest import Manifest
from snapshotter.ram_tier_entry import (
    TMP_PREFIX,
    TRASH_PREFIX,
    BadEntry,
    FileShape,
    TierFile,
    check_files,
    map_all,
    populate_files,
    read_meta,
    rewrite_meta,
    touch,
    write_entry,
    write_json_atomic,
)

log = logging.getLogger(__name__)

# Weight of the newest read in the shared bandwidth average.
_BANDWIDTH_NEW_WEIGHT = 0.3


@dataclass(frozen=True)
class RamTierHit:
    """A ``get`` that found the manifest: one CPU uint8 buffer per file, in plan order.

    The buffers are populated mappings of the tier's files (private copy-on-write,
    or read-only shared); they belong to the caller and stay valid after the entry
    is evicted. ``map_s`` includes populating them. ``files`` are the entry's
    files with their recorded checksums; with ``checked`` False (a ``get`` with
    ``check=False``) the caller checks each piece before it uses it, and reports
    a mismatch with ``RamTier.corrupt``.
    """

    buffers: list[torch.Tensor]
    total_bytes: int
    map_s: float
    verify_s: float
    files: list[TierFile]
    checked: bool = True


@dataclass(frozen=True)
class RamTierInventory:
    """What the worker reports: manifest digest -> data bytes held, and the read rate."""

    manifests: Mapping[str, int]
    total_bytes: int
    max_bytes: int
    read_bytes_per_s: float | None  # None until some process has read from the tier


@dataclass
class RamTierCounters:
    """This process's tier activity; read with ``RamTier.counters()``."""

    hits: int = 0
    misses: int = 0
    corrupt: int = 0
    rehashed: int = 0  # older entries (no checksums) checked with their digests, recorded
    inserts: int = 0
    insert_errors: int = 0
    too_large: int = 0
    evictions: int = 0


class RamTier:
    """Shared-memory weights by manifest digest, LRU under a byte cap. Thread- and
    process-safe (several replica processes on one worker share the directory)."""

    def __init__(self, config: RamTierConfig) -> None:
        self.config = config
        self.root = Path(config.directory)
        self.entries_dir = self.root / "entries"
        try:
            self.entries_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(
                f"cannot create the RAM tier at {self.root}: {exc}; point THAW_RAM_TIER_DIR "
                "at a writable tmpfs directory, or set THAW_RAM_TIER_MAX_BYTES=0 to turn it off"
            ) from exc
        self._lock_path = self.root / ".lock"
        self._counters = RamTierCounters()
        self._counter_lock = threading.Lock()

    # --- queries -------------------------------------------------------------
    def entry_dir(self, manifest_digest: str) -> Path:
        return self.entries_dir / hex_part(manifest_digest)

    def __contains__(self, manifest_digest: object) -> bool:
        if not isinstance(manifest_digest, str) or not is_digest(manifest_digest):
            return False
        return (self.entry_dir(manifest_digest) / "meta.json").is_file()

    def contains_bytes(self, manifest: Manifest) -> int:
        """Tensor (data-region) bytes of ``manifest`` held here: all of them or 0."""
        try:
            meta = read_meta(self.entry_dir(manifest.digest))
        except BadEntry:
            return 0
        return sum(f.data_bytes for f in meta) if meta is not None else 0

    def inventory(self) -> RamTierInventory:
        held = {d: e.size_bytes for d, e in self._scan().items()}
        return RamTierInventory(
            held, sum(held.values()), self.config.max_bytes, self.read_bytes_per_s()
        )

    def counters(self) -> RamTierCounters:
        with self._counter_lock:
            return RamTierCounters(
                **{f.name: getattr(self._counters, f.name) for f in fields(self._counters)}
            )

    def recent(self) -> list[str]:
        """Manifest digests held, the most recently used first."""
        held = self._scan()
        return sorted(held, key=lambda d: held[d].last_used_ns, reverse=True)

    def record_hit(self, manifest_digest: str) -> None:
        """Count a hit served from mappings this process held ahead (``snapshotter.
        loader_pinned``) and mark the entry used, as ``get`` does."""
        touch(self.entry_dir(manifest_digest) / "meta.json")
        self._count(hits=1)

    def get_manifest(self, manifest_digest: str) -> bytes | None:
        """The held manifest's JSON, only if it still hashes to ``manifest_digest``."""
        try:
            data = (self.entry_dir(manifest_digest) / "manifest.json").read_bytes()
        except OSError:  # absent or unreadable: the disk cache or the store has it
            return None
        return data if digest_bytes(data) == manifest_digest else None

    # --- reads ---------------------------------------------------------------
    def get(
        self,
        manifest_digest: str,
        files: Sequence[FileShape],
        *,
        read_only: bool = False,
        check: bool = True,
    ) -> RamTierHit | None:
        """Map every file buffer of the manifest, or None (a miss: load it elsewhere).

        ``files`` is the load plan's files, in order; an entry that does not
        match them, or (with ``verify``) whose bytes do not match the checksums
        recorded at insert, is dropped and counted as ``corrupt``. ``read_only``:
        shared read-only mappings, for a copy to a device (see the module
        docstring), left unpopulated with ``check=False``: then (with ``verify``)
        the caller checks each piece as it copies it (``RamTierHit.checked``
        False), populating it first, and an older entry with no checksums is
        checked here all the same.
        """
        start = time.perf_counter()
        entry = self.entry_dir(manifest_digest)
        deferred = read_only and not check and self.config.verify
        # Checked here: each checking thread populates its own pieces, so map_s is the
        # mapping alone and verify_s both; unchecked, the pieces are populated at once.
        populate = not self.config.verify
        try:
            found = _map_entry(entry, files, read_only, populate=populate)
            if found is None:  # absent, or evicted while we looked
                self._count(misses=1)
                return None
            meta, buffers = found
            map_s = time.perf_counter() - start
            if deferred and any(f.checksums is None for f in meta):
                deferred = False
            if self.config.verify and not deferred:
                checked = check_files(meta, buffers)
                if checked != meta:
                    self.record_checksums(manifest_digest, meta, checked)
                    meta = checked
        except BadEntry as exc:
            self.corrupt(manifest_digest, str(exc))
            return None
        touch(entry / "meta.json")
        self._count(hits=1)
        total = sum(f.data_bytes for f in meta)
        verify_s = time.perf_counter() - start - map_s
        return RamTierHit(buffers, total, map_s, verify_s, meta, checked=not deferred)

    def map(self, manifest_digest: str, files: Sequence[FileShape]) -> list[torch.Tensor] | None:
        """Private mappings of an entry just ``put`` (not re-verified, not counted); None
        when it is not there any more."""
        try:
            found = _map_entry(self.entry_dir(manifest_digest), files)
        except BadEntry:
            return None
        return None if found is None else found[1]

    def record_read(self, nbytes: int, seconds: float) -> None:
        """Fold one load's read rate from the tier into the shared moving average."""
        if nbytes <= 0 or seconds <= 0:
            return
        rate = nbytes / seconds
        old = self.read_bytes_per_s()
        new = rate if old is None else old + _BANDWIDTH_NEW_WEIGHT * (rate - old)
        with contextlib.suppress(OSError):  # a lost sample only ages the average
            write_json_atomic(self.root / "bandwidth.json", {"bytes_per_s": new})

    def read_bytes_per_s(self) -> float | None:
        """Measured bytes per second of loads served by the tier (any process)."""
        try:
            doc = json.loads((self.root / "bandwidth.json").read_bytes())
            return float(doc["bytes_per_s"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    # --- writes --------------------------------------------------------------
    def put(
        self,
        manifest_digest: str,
        manifest_json: bytes,
        files: Sequence[FileShape],
        buffers: Sequence[torch.Tensor],
    ) -> bool:
        """Hold a verified load's buffers (CPU or CUDA); True when the entry is held after.

        Evicts least recently used entries to make room. Never raises for a
        full tmpfs or an artifact over the cap: the insert is skipped (and
        counted); the caller's tensors are untouched either way.
        """
        total = sum(f.data_bytes for f in files)
        if total > self.config.max_bytes:
            self._count(too_large=1)
            return False
        entry = self.entry_dir(manifest_digest)
        with self._locked():
            if (entry / "meta.json").is_file():
                touch(entry / "meta.json")
                return True
            self._clear_debris()
            for victim in choose_victims(self._scan(prune=True), self.config.max_bytes, total):
                self._remove(self.entry_dir(victim))
                self._count(evictions=1)
            try:
                write_entry(entry, manifest_digest, manifest_json, files, buffers)
            except OSError as exc:
                self._count(insert_errors=1)
                log.warning("weights %s not kept in the RAM tier: %s", manifest_digest, exc)
                return False
        self._count(inserts=1)
        return True

    def drop(self, manifest_digest: str) -> None:
        """Remove an entry (e.g. a corrupt one); readers holding its mappings keep them."""
        with self._locked():
            self._remove(self.entry_dir(manifest_digest))

    def record_checksums(
        self, manifest_digest: str, held: list[TierFile], checked: list[TierFile]
    ) -> None:
        """Record ``checked`` (every file with its checksum) for an older entry whose
        meta.json is ``held``, just checked with its digests; best effort."""
        self._count(rehashed=1)
        entry = self.entry_dir(manifest_digest)
        try:
            with self._locked():
                if read_meta(entry) == held:  # not replaced or removed meanwhile
                    rewrite_meta(entry, manifest_digest, checked)
        except (OSError, BadEntry) as exc:  # checked with its digests again next time
            log.warning("RAM tier entry %s not recorded: %s", manifest_digest, exc)

    # --- internals -----------------------------------------------------------
    def corrupt(self, manifest_digest: str, why: str) -> None:
        """Drop an entry whose bytes failed a check (counted as ``corrupt`` and a miss)."""
        log.warning(
            "RAM tier entry %s is corrupt (%s); dropped, loading from the disk cache",
            manifest_digest,
            why,
        )
        self._count(corrupt=1, misses=1)
        try:
            self.drop(manifest_digest)
        except OSError as exc:  # the load goes on from the disk cache either way
            log.warning("cannot drop RAM tier entry %s: %s", manifest_digest, exc)

    def _count(self, **deltas: int) -> None:
        with self._counter_lock:
            for name, delta in deltas.items():
                setattr(self._counters, name, getattr(self._counters, name) + delta)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        # Someone may have emptied the tmpfs (a reboot does): start the tier again.
        self.entries_dir.mkdir(parents=True, exist_ok=True)
        # A fresh open file description per call, so threads exclude each other too.
        with open(self._lock_path, "a+b") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)

    def _scan(self, prune: bool = False) -> dict[str, CacheEntry]:
        """Held entries: manifest digest -> (data bytes, last use), from the directory.

        ``prune`` (only under the lock) removes entries whose meta.json is bad.
        """
        out: dict[str, CacheEntry] = {}
        for entry in _list(self.entries_dir):
            if entry.name.startswith((TMP_PREFIX, TRASH_PREFIX)):
                continue
            try:
                meta = read_meta(entry)
                mtime_ns = (entry / "meta.json").stat().st_mtime_ns
            except BadEntry:
                if prune:
                    self._remove(entry)
                continue
            except FileNotFoundError:
                continue
            if meta is not None:
                out["blake3:" + entry.name] = CacheEntry(sum(f.data_bytes for f in meta), mtime_ns)
        return out

    def _clear_debris(self) -> None:
        # Under the lock no write is in progress, so any temp or trash dir is a
        # crashed process's leftover.
        for entry in _list(self.entries_dir):
            if entry.name.startswith((TMP_PREFIX, TRASH_PREFIX)):
                shutil.rmtree(entry, ignore_errors=True)

    def _remove(self, entry: Path) -> None:
        trash = self.entries_dir / f"{TRASH_PREFIX}{uuid.uuid4().hex}"
        try:
            entry.rename(trash)
        except FileNotFoundError:
            return
        shutil.rmtree(trash, ignore_errors=True)


def _list(directory: Path) -> list[Path]:
    """The directory's entries; none when the directory itself is gone."""
    try:
        return list(directory.iterdir())
    except FileNotFoundError:
        return []


def _map_entry(
    entry: Path, files: Sequence[FileShape], read_only: bool = False, populate: bool = True
) -> tuple[list[TierFile], list[torch.Tensor]] | None:
    """(meta, mappings, populated unless not ``populate``) of an entry matching
    ``files``; None when it is absent.

    Raises ``BadEntry`` when the entry is unreadable or does not match ``files``.
    """
    meta = read_meta(entry)
    if meta is None:
        return None
    if [(f.path, f.data_bytes) for f in meta] != [(f.path, f.data_bytes) for f in files]:
        raise BadEntry("its files differ from the manifest's")
    buffers = map_all(entry, meta, read_only=read_only)
    if buffers is None:
        return None
    if populate:
        populate_files(meta, buffers)
    return meta, buffers
