"""The worker's disk chunk cache: framed chunk objects by digest, LRU by bytes.

Layout under ``CacheConfig.directory``::

    chunks/<hex[:2]>/<hex>     a framed chunk, byte-identical to the store's object
    chunks/<hex[:2]>/.tmp-*    a write in progress (removed on error, ignored on scan)
    manifests/<hex>            a manifest's canonical JSON (immutable, tiny, not evicted)

LRU state is the file's mtime: a hit sets it to now, so the order of last use
survives a restart (the index is rebuilt from a directory scan). Eviction is a
pure function, ``choose_victims``, of (entries, cap, incoming size).

Contracts:

- A reader never sees a partial entry: writes go to a temp file that is
  renamed into place. On any error the temp file is removed; ENOSPC raises
  ``CacheFullError``.
- The cache does not verify digests; its caller (``snapshotter.source``)
  hashes every chunk it reads and calls ``drop`` on a mismatch. The cache
  checks only the frame header against the declared size.
- The loader writes entries raw-framed (``put_raw``) whatever the store's
  codec, trading disk for a hit that is a plain ``readinto``; ``read_into``
  also decodes zstd-framed entries (``put``).
- Entries are not fsynced: a crash can leave a truncated or stale entry, which
  verification on read catches and replaces from the store.
- Thread-safe within a process. Several processes may read the same
  directory; each keeps its own index (``refresh`` rescans).
"""

from __future__ import annotations

import errno
import io
import os
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from snapshotter import codec
from snapshotter.config import CacheConfig
from snapshotter.digest import digest_bytes, hex_part
from snapshotter.errors import CacheFullError, IntegrityError, StoreError
from snapshotter.manifest import ChunkRef, Manifest

_TMP_PREFIX = ".tmp-"


@dataclass(frozen=True)
class CacheEntry:
    size_bytes: int
    last_used_ns: int


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
    def read_into(self, chunk: ChunkRef, dest: memoryview) -> bool:
        """Decode a cached chunk into ``dest``; False on a miss.

        Raw entries are read straight into ``dest`` after the frame header (no
        intermediate buffer). The digest is NOT checked here. Raises
        ``IntegrityError`` when the entry's frame is wrong; ``dest`` is then
        undefined and the caller should ``drop`` the entry.
        """
        try:
            f = open(self.path(chunk.digest), "rb", buffering=0)  # noqa: SIM115
        except FileNotFoundError:
            self._forget(chunk.digest)
            return False
        with f:
            # One sequential pass: ask for aggressive readahead.
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
            header = f.read(codec.HEADER_SIZE)
            kind, _ = codec.read_header(header, chunk.size)
            if kind is codec.Codec.RAW:
                _readinto_exact(f, dest, chunk.digest)
            else:
                codec.decode_into(header + f.read(), dest, chunk.size)
        self._touch(chunk.digest)
        return True

    def get(self, digest: str) -> bytes | None:
        """The framed object, or None on a miss (not verified)."""
        try:
            data = self.path(digest).read_bytes()
        except FileNotFoundError:
            self._forget(digest)
            return None
        self._touch(digest)
        return data

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
        """Store a framed chunk atomically, evicting LRU entries to make room.

        Raises ``CacheFullError`` when the entry cannot fit under the cap or the
        disk is full; nothing partial is left behind.
        """
        self._put_parts(digest, [memoryview(framed).cast("B")])

    def put_raw(self, digest: str, raw: memoryview) -> None:
        """Store verified raw bytes as a raw-framed entry (no copy of ``raw``).

        The loader caches every chunk decoded: a hit is then one ``readinto``,
        because decompressing zstd (~1 GB/s per core) is slower than reading
        local disk. Errors as ``put``.
        """
        header = codec.HEADER.pack(codec.MAGIC, codec.Codec.RAW, len(raw))
        self._put_parts(digest, [memoryview(header), raw.cast("B")])

    def _put_parts(self, digest: str, parts: list[memoryview]) -> None:
        size = sum(len(p) for p in parts)
        with self._lock:
            if digest in self._entries:
                return
            victims = choose_victims(self._entries, self.config.max_bytes, size, (digest,))
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
            self._forget(digest)
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


def _readinto_exact(f: io.FileIO, dest: memoryview, digest: str) -> None:
    """Fill ``dest`` from an unbuffered file; the file must end right after."""
    total = len(dest)
    got = 0
    while got < total:
        n = f.readinto(dest[got:])
        if not n:
            raise IntegrityError(f"cached chunk {digest} is truncated at {got} of {total} bytes")
        got += n
    if f.read(1):
        raise IntegrityError(f"cached chunk {digest} is longer than its declared {total} bytes")


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
