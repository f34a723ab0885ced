"""The worker's disk chunk cache: framed chunk objects by digest, LRU by bytes.

Layout under ``CacheConfig.directory``::

    chunks/<hex[:2]>/<hex>     an entry: a chunk's bytes behind a header that records their
                               checksum (``snapshotter.cache_entry``)
    chunks/<hex[:2]>/.tmp-*    a write in progress (removed on error, ignored on scan)
    manifests/<hex>            a manifest's canonical JSON (immutable, tiny, not evicted)

LRU state is the file's mtime: a hit sets it to now, so the order of last use
survives a restart (the index is rebuilt from a directory scan). Eviction is a
pure function, ``choose_victims``, of (entries, cap, incoming size).

Contracts:

- A reader never sees a partial entry: writes go to a temp file that is
  renamed into place. On any error the temp file is removed; ENOSPC raises
  ``CacheFullError``.
- Every entry records the checksum (xxh3) of its raw bytes, computed by the
  writer from bytes it verified against their digest, in the same file.
  The cache does not check bytes: ``read_into`` returns the recorded
  checksum and its caller (``snapshotter.source``) compares it, or the
  digest for an older entry that records none (then ``record``s one), and
  calls ``drop`` on a mismatch. The cache checks only the header against the
  declared size and the entry's length.
- The loader writes entries raw (``put_raw``) whatever the store's codec,
  trading disk for a hit that is a plain ``readinto``; ``read_into`` also
  decodes zstd entries (``put``).
- Mapped hits: ``put_raw`` is told where the chunk's first byte falls within a
  page of a load's (page-aligned) buffer and pads the header so the payload
  sits at that same offset within a page of the entry file. A CPU load then
  asks ``read_into`` to map the entry's whole pages into its buffer
  (``MAP_PRIVATE | MAP_FIXED``, populated for reading: the page cache's own
  pages, copy-on-write, no copy) and reads only the partial pages at the
  chunk's ends. A chunk placed at two offsets within a page (shared between
  files) maps at the one its entry was written for and is copied elsewhere;
  zstd and older entries are read. The cache never writes an entry in place
  (eviction, ``drop`` and ``record`` unlink or rename), so a mapping keeps the
  inode it was checked against; truncating an entry file in place under a
  live load would make its tensors fault (``SIGBUS``), as with any mmap'd weights.
  Where the kernel refuses to map an entry (a filesystem without mmap), the
  cache logs it once and reads from then on.
- Entries are not fsynced: a crash can leave a truncated or stale entry, which
  the check on read catches and replaces from the store.
- Thread-safe within a process. Several processes may read the same
  directory; each keeps its own index (``refresh`` rescans).
"""

from __future__ import annotations

import errno
import io
import logging
import os
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from snapshotter import cache_entry, codec, pages
from snapshotter.config import CacheConfig
from snapshotter.digest import checksum_bytes, digest_bytes, hex_part
from snapshotter.errors import CacheFullError, IntegrityError, StoreError
from snapshotter.manifest import ChunkRef, Manifest

_TMP_PREFIX = ".tmp-"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CacheEntry:
    size_bytes: int
    last_used_ns: int


@dataclass(frozen=True)
class CacheHit:
    """A chunk read from the cache: ``checksum`` is what its entry recorded at insert,
    None for an older entry that records none (its bytes are then untrusted);
    ``mapped_bytes`` of it were mapped, not copied (``read_into``'s ``map_pages``)."""

    checksum: int | None
    mapped_bytes: int = 0


@dataclass(frozen=True)
class CacheInventory:
    """What the worker reports in its heartbeat."""

    digests: frozenset[str]
    total_bytes: int
    max_bytes: int


def choose_victims(
    entries: Mapping[str, CacheEntry],
    cap_bytes: int,
    incoming_bytes: int,
    protected: Iterable[str] = (),
) -> list[str]:
    """Entries to evict so that ``incoming_bytes`` fits under ``cap_bytes``.

    Least recently used first (ties broken by digest, so the choice is
    deterministic); ``protected`` digests are never chosen. Returns ``[]``
    when it already fits. Raises ``CacheFullError`` when it cannot fit even
    after evicting every unprotected entry.
    """
    used = sum(e.size_bytes for e in entries.values())
    excess = used + incoming_bytes - cap_bytes
    if excess <= 0:
        return []
    keep = set(protected)
    candidates = sorted(
        (e.last_used_ns, d, e.size_bytes) for d, e in entries.items() if d not in keep
    )
    victims: list[str] = []
    for _last_used, digest, size in candidates:
        if excess <= 0:
            break
        victims.append(digest)
        excess -= size
    if excess > 0:
        raise CacheFullError(
            f"cannot fit {incoming_bytes} bytes in a cache capped at {cap_bytes} bytes; "
            "raise THAW_CACHE_MAX_BYTES"
        )
    return victims


class DiskCache:
    """Chunk objects on local disk, capped at ``config.max_bytes``."""

    def __init__(self, config: CacheConfig) -> None:
        self.config = config
        self.root = Path(config.directory) / "chunks"
        self.root.mkdir(parents=True, exist_ok=True)
        self.manifest_root = Path(config.directory) / "manifests"
        self._lock = threading.Lock()
        self._entries: dict[str, CacheEntry] = {}
        self._writing: set[str] = set()  # reserved in _entries, file not yet renamed in
        self._total_bytes = 0
        self._map_refused = False  # set when a mapping failed: read from then on
        self.refresh()

    # --- index ---------------------------------------------------------------
    def refresh(self) -> None:
        """Rebuild the index from the directory (last use = file mtime)."""
        entries: dict[str, CacheEntry] = {}
        for sub in self.root.iterdir():
            if not sub.is_dir():
                continue
            for path in sub.iterdir():
                if path.name.startswith(_TMP_PREFIX):
                    continue
                try:
                    st = path.stat()
                except FileNotFoundError:
                    continue
                entries["blake3:" + path.name] = CacheEntry(st.st_size, st.st_mtime_ns)
        with self._lock:
            self._entries = entries
            self._total_bytes = sum(e.size_bytes for e in entries.values())

    def path(self, digest: str) -> Path:
        h = hex_part(digest)
        return self.root / h[:2] / h

    def __contains__(self, digest: object) -> bool:
        with self._lock:
            return digest in self._entries and digest not in self._writing

    def entries(self) -> dict[str, CacheEntry]:
        with self._lock:
            return dict(self._entries)

    @property
    def total_bytes(self) -> int:
        return self._total_bytes

    def inventory(self) -> CacheInventory:
        with self._lock:
            return CacheInventory(
                frozenset(self._entries), self._total_bytes, self.config.max_bytes
            )

    def contains_bytes(self, manifest: Manifest) -> int:
        """Raw (decoded) bytes of the manifest's distinct chunks held here."""
        with self._lock:
            return sum(c.size for d, c in manifest.unique_chunks().items() if d in self._entries)

    # --- reads ---------------------------------------------------------------
    def read_into(
        self, chunk: ChunkRef, dest: memoryview, *, map_pages: bool = False
    ) -> CacheHit | None:
        """Decode a cached chunk into ``dest``; None on a miss.

        Raw entries are read straight into ``dest`` after the header (no
        intermediate buffer). With ``map_pages`` the caller promises that ``dest``
        lies in a private anonymous mapping it owns (``snapshotter.pages``): the
        whole pages of a raw entry whose payload sits at ``dest``'s offset within a
        page are then mapped into ``dest`` (copy-on-write, populated) instead of read,
        the partial pages at its ends read; any other entry is read as without it.
        The bytes are NOT checked here: the caller compares them with the hit's
        checksum. Raises ``IntegrityError`` when the entry's header or length is
        wrong; ``dest`` is then undefined and the caller should ``drop`` the entry.
        """
        try:
            f = open(self.path(chunk.digest), "rb", buffering=0)  # noqa: SIM115
        except FileNotFoundError:
            self._forget(chunk.digest)
            return None
        with f:
            header = cache_entry.read_header(f.read(cache_entry.HEADER_SIZE), chunk.size)
            mapped_bytes = 0
            if header.codec is codec.Codec.RAW:
                _check_length(f, header.header_bytes + chunk.size, chunk.digest)
                if map_pages and not self._map_refused:
                    mapped_bytes = self._map_into(f, header.header_bytes, dest, chunk.digest)
                if not mapped_bytes:
                    # One sequential pass: ask for aggressive readahead.
                    os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
                    _read_exact(f, header.header_bytes, dest, chunk.digest)
            else:
                f.seek(header.header_bytes)
                codec.decode_payload_into(header.codec, memoryview(f.read()), dest)
        self._touch(chunk.digest)
        return CacheHit(header.checksum, mapped_bytes)

    def _map_into(self, f: io.FileIO, payload_at: int, dest: memoryview, digest: str) -> int:
        """Map the entry's whole pages inside ``dest`` over it and read the rest; the
        bytes mapped, 0 (nothing done) when the payload is at another offset within a
        page than ``dest`` or covers no whole page there.

        The mapping is private: the entry's file is never written through it. It
        keeps the entry's inode: eviction and ``record`` unlink or rename over the
        path, never write in place, so a load's tensors keep the bytes they were
        checked with after the entry is gone (the pages are freed with the tensors).
        """
        address = pages.address_of(dest)
        if (payload_at - address) % pages.PAGE_BYTES:
            return 0
        first = pages.round_up(address) - address
        last = pages.round_down(address + len(dest)) - address
        if last - first < pages.PAGE_BYTES:
            return 0
        try:
            pages.map_file_over(address + first, last - first, f.fileno(), payload_at + first)
        except OSError as exc:
            # A filesystem that refuses mmap: read, now and from now on.
            log.warning("disk cache %s cannot be mapped (%s): reading it", self.root, exc)
            self._map_refused = True
            return 0
        try:
            pages.populate_read(address + first, last - first)
        except OSError as exc:  # an I/O error, or the file shrank: no page of it stays
            pages.anonymous_over(address + first, last - first)
            raise IntegrityError(f"cached chunk {digest} cannot be read: {exc.strerror}") from None
        _read_exact(f, payload_at, dest[:first], digest)
        _read_exact(f, payload_at + last, dest[last:], digest)
        return last - first

    # --- manifests -----------------------------------------------------------
    def get_manifest(self, digest: str) -> bytes | None:
        """A cached manifest's bytes, only if they still hash to ``digest``."""
        path = self.manifest_root / hex_part(digest)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        if digest_bytes(data) != digest:
            path.unlink(missing_ok=True)
            return None
        return data

    def put_manifest(self, digest: str, data: bytes) -> None:
        """Keep a manifest (content-addressed, so never stale); errors as ``put``."""
        _write_atomic(self.manifest_root / hex_part(digest), [memoryview(data)])

    # --- writes --------------------------------------------------------------
    def put(self, digest: str, framed: bytes | memoryview) -> None:
        """Store a store's framed chunk (verified by the caller) atomically, keeping its
        codec, with the checksum of its raw bytes; evicts LRU entries to make room.

        Raises ``CacheFullError`` when the entry cannot fit under the cap or the
        disk is full; nothing partial is left behind.
        """
        view = memoryview(framed).cast("B")
        raw_size = codec.HEADER.unpack_from(view)[2] if len(view) >= codec.HEADER_SIZE else 0
        kind, payload = codec.read_header(view, raw_size)
        raw = payload if kind is codec.Codec.RAW else memoryview(codec.decode(view, raw_size))
        header = cache_entry.pack_header(kind, raw_size, checksum_bytes(raw))
        self._put_parts(digest, [memoryview(header), payload])

    def put_raw(
        self,
        digest: str,
        raw: memoryview,
        checksum: int | None = None,
        page_offset: int | None = None,
    ) -> None:
        """Store verified raw bytes as a raw entry (no copy of ``raw``); ``checksum``
        is ``checksum_bytes(raw)`` when the caller has it, else computed here;
        ``page_offset``, the offset within a page of the chunk's first byte in a
        load's page-aligned buffer, places the payload so that a later load can map
        it (``read_into``'s ``map_pages``).

        The loader caches every chunk decoded: a hit is then one ``readinto``,
        because decompressing zstd (~1 GB/s per core) is slower than reading
        local disk. Errors as ``put``.
        """
        self._put_parts(digest, _raw_parts(raw, checksum, page_offset))

    def record(self, digest: str, raw: memoryview, page_offset: int | None = None) -> None:
        """Write an older entry (one that records no checksum) again, raw, with the
        checksum of ``raw``: its bytes, just verified against ``digest``. Atomic:
        readers see the old entry or the new one. Errors as ``put``; the old entry
        is then kept; ``page_offset`` as ``put_raw``."""
        self._put_parts(digest, _raw_parts(raw, None, page_offset), replace=True)

    def _put_parts(self, digest: str, parts: list[memoryview], replace: bool = False) -> None:
        size = sum(len(p) for p in parts)
        with self._lock:
            if digest in self._writing or (digest in self._entries and not replace):
                return
            old = self._entries.pop(digest, None)
            self._total_bytes -= old.size_bytes if old is not None else 0
            try:
                victims = choose_victims(self._entries, self.config.max_bytes, size, (digest,))
            except CacheFullError:
                self._restore_locked(digest, old)
                raise
            for victim in victims:
                self._remove_locked(victim)
            # Reserve the space now so concurrent puts do not overshoot the cap.
            self._entries[digest] = CacheEntry(size, time.time_ns())
            self._total_bytes += size
            self._writing.add(digest)
        try:
            _write_atomic(self.path(digest), parts)
        except BaseException:
            with self._lock:
                self._writing.discard(digest)
                if self._entries.pop(digest, None) is not None:  # not dropped meanwhile
                    self._total_bytes -= size
                self._restore_locked(digest, old)
            raise
        with self._lock:
            self._writing.discard(digest)

    def drop(self, digest: str) -> None:
        """Remove an entry (e.g. one that failed verification)."""
        with self._lock:
            self._remove_locked(digest)
        self.path(digest).unlink(missing_ok=True)

    # --- internals -----------------------------------------------------------
    def _remove_locked(self, digest: str) -> None:
        entry = self._entries.pop(digest, None)
        if entry is not None:
            self._total_bytes -= entry.size_bytes
            self.path(digest).unlink(missing_ok=True)

    def _restore_locked(self, digest: str, old: CacheEntry | None) -> None:
        # A failed rewrite leaves the old file in place: keep indexing it.
        if old is not None:
            self._entries[digest] = old
            self._total_bytes += old.size_bytes

    def _forget(self, digest: str) -> None:
        with self._lock:
            if digest in self._writing:
                return
            entry = self._entries.pop(digest, None)
            if entry is not None:
                self._total_bytes -= entry.size_bytes

    def _touch(self, digest: str) -> None:
        now_ns = time.time_ns()
        try:
            os.utime(self.path(digest), ns=(now_ns, now_ns))
        except FileNotFoundError:
            return
        except OSError:
            pass  # a read-only cache (a container's view of the worker's): last use stays in RAM
        with self._lock:
            entry = self._entries.get(digest)
            if entry is not None:
                self._entries[digest] = CacheEntry(entry.size_bytes, now_ns)


def _raw_parts(raw: memoryview, checksum: int | None, page_offset: int | None) -> list[memoryview]:
    raw = raw.cast("B")
    recorded = checksum_bytes(raw) if checksum is None else checksum
    kind = codec.Codec.RAW
    payload_at = cache_entry.payload_offset(kind, len(raw), page_offset, pages.PAGE_BYTES)
    header = cache_entry.pack_header(kind, len(raw), recorded, payload_at)
    return [memoryview(header), raw]


def _check_length(f: io.FileIO, expected: int, digest: str) -> None:
    """A raw entry must end right after its payload."""
    size = os.fstat(f.fileno()).st_size
    if size < expected:
        raise IntegrityError(f"cached chunk {digest} is truncated: {size} of {expected} bytes")
    if size > expected:
        raise IntegrityError(f"cached chunk {digest} is longer than its declared {expected} bytes")


def _read_exact(f: io.FileIO, offset: int, dest: memoryview, digest: str) -> None:
    """Fill ``dest`` from an unbuffered file, from ``offset``."""
    f.seek(offset)
    total = len(dest)
    got = 0
    while got < total:
        n = f.readinto(dest[got:])
        if not n:
            raise IntegrityError(f"cached chunk {digest} is truncated at {got} of {total} bytes")
        got += n


def _write_all(fd: int, data: memoryview) -> None:
    """Write every byte of ``data`` to ``fd`` (a seam tests use to inject ENOSPC)."""
    while data:
        n = os.write(fd, data)
        data = data[n:]


def _write_atomic(path: Path, parts: list[memoryview]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=_TMP_PREFIX)
    try:
        try:
            for part in parts:
                _write_all(fd, part)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            raise CacheFullError(
                f"the cache disk is full while writing {path}, a "
                f"{sum(len(p) for p in parts)}-byte chunk; free space or lower "
                "THAW_CACHE_MAX_BYTES"
            ) from exc
        if isinstance(exc, OSError):
            raise StoreError(f"cannot write cache entry {path}: {exc}") from exc
        raise
