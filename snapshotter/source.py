"""Where a chunk's bytes come from: the disk cache in front of the store.

A chunk goes through two stages, so the loader can run them in separate
thread pools (I/O-bound fetches, CPU-bound verification)::

    fetch(chunk, dest)           cache hit: read straight into dest (entries are raw),
                                            or map the entry's whole pages into it
                                 miss:      store get -> framed bytes
    finish(fetched, dest)        cache hit: xxh3(dest) == the checksum its entry records
                                            (an older entry with none: blake3(dest) ==
                                            chunk digest, then the entry is recorded)
                                 store:     decode into dest (capped),
                                            verify blake3(dest) == chunk digest,
                                            write through to the cache, raw, with xxh3(dest)

Trust changes at the store: bytes from it are checked against their digest.
Bytes the node wrote itself are checked against the checksum it recorded
then, at memory speed (``snapshotter.digest`` has the two checks).

Failures: a cache entry whose header, length or checksum is wrong is dropped
and the chunk is fetched again from the store (counted in ``cache_corrupt``); a
store object that fails verification raises ``IntegrityError`` naming the
chunk digest, and is never written to the cache. A cache that cannot take a
write (full disk) does not fail the load: the chunk is used, the write is
counted in ``cache_write_errors``.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from dataclasses import dataclass, fields

from snapshotter import codec
from snapshotter.cache import DiskCache
from snapshotter.digest import checksum_bytes, digest_bytes
from snapshotter.errors import IntegrityError, StoreError
from snapshotter.manifest import ChunkRef
from snapshotter.registry import Registry

log = logging.getLogger(__name__)


class Tier(enum.StrEnum):
    CACHE = "cache"
    STORE = "store"


@dataclass
class SourceCounters:
    """Cumulative over the source's life; read with ``ChunkSource.counters()``."""

    store_gets: int = 0
    store_bytes: int = 0
    cache_hits: int = 0
    cache_hit_bytes: int = 0
    cache_mapped_bytes: int = 0  # of the hits, mapped into the buffers rather than copied
    cache_misses: int = 0
    cache_corrupt: int = 0
    cache_rehashed: int = 0  # older entries (no checksum) checked with the digest, recorded
    cache_write_errors: int = 0


@dataclass
class Fetched:
    """A chunk after the fetch stage: a cache hit is already in ``dest`` (``obj`` None,
    ``checksum`` what its entry records, None for an older entry); a store object is
    in ``obj``, to be decoded into ``dest`` in stage 2."""

    chunk: ChunkRef
    tier: Tier
    obj: bytes | None
    fetch_s: float
    fetched_bytes: int
    checksum: int | None = None
    page_offset: int | None = None  # the chunk's first byte's offset within a buffer page
    mapped_bytes: int = 0  # of a cache hit, mapped into dest rather than copied


@dataclass(frozen=True)
class Finished:
    tier: Tier
    decode_s: float
    refetch_s: float


class ChunkSource:
    """Cache tier in front of a registry's store. Thread-safe."""

    def __init__(self, registry: Registry, cache: DiskCache | None = None) -> None:
        self.registry = registry
        self.cache = cache
        self._lock = threading.Lock()
        self._counters = SourceCounters()

    def counters(self) -> SourceCounters:
        with self._lock:
            return SourceCounters(
                **{f.name: getattr(self._counters, f.name) for f in fields(self._counters)}
            )

    def _count(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                setattr(self._counters, name, getattr(self._counters, name) + delta)

    # --- stage 1 -------------------------------------------------------------
    def fetch(
        self,
        chunk: ChunkRef,
        dest: memoryview,
        *,
        page_offset: int | None = None,
        map_pages: bool = False,
    ) -> Fetched:
        """Bring a chunk close: into ``dest`` from the cache, or as bytes from the store.

        ``page_offset`` (the offset within a page of the chunk's first byte in a
        load's page-aligned buffer) lets the cache place an entry written for it
        so that it can be mapped; ``map_pages``: ``dest`` lies in a private mapping
        the caller owns, into which a cache hit's pages may be mapped
        (``DiskCache.read_into``).
        """
        start = time.perf_counter()
        if self.cache is not None and chunk.digest in self.cache:
            hit = self._fetch_cached(chunk, dest, map_pages)
            if hit is not None:
                hit.fetch_s = time.perf_counter() - start
                hit.page_offset = page_offset
                return hit
        if self.cache is not None:
            self._count(cache_misses=1)
        obj = self._get_stored(chunk)
        fetch_s = time.perf_counter() - start
        return Fetched(chunk, Tier.STORE, obj, fetch_s, len(obj), page_offset=page_offset)

    def _fetch_cached(self, chunk: ChunkRef, dest: memoryview, map_pages: bool) -> Fetched | None:
        # Entries are raw (see ``_write_through``): read, or mapped, straight into dest.
        assert self.cache is not None
        try:
            hit = self.cache.read_into(chunk, dest, map_pages=map_pages)
        except IntegrityError as exc:
            self._drop_corrupt(chunk, exc)
            return None
        if hit is None:
            return None
        self._count(cache_hits=1, cache_hit_bytes=chunk.size, cache_mapped_bytes=hit.mapped_bytes)
        return Fetched(
            chunk, Tier.CACHE, None, 0.0, chunk.size, hit.checksum, mapped_bytes=hit.mapped_bytes
        )

    # --- stage 2 -------------------------------------------------------------
    def finish(self, fetched: Fetched, dest: memoryview) -> Finished:
        """Check a cache hit in ``dest``, or decode and verify a store object into it; on
        return ``dest`` holds the chunk.

        Raises ``IntegrityError`` (naming the chunk digest) when the store's
        object is corrupt; ``dest`` is then undefined.
        """
        start = time.perf_counter()
        chunk = fetched.chunk
        refetch_s = 0.0
        if fetched.tier is Tier.CACHE:
            if self._cached_intact(fetched, dest):
                return Finished(Tier.CACHE, time.perf_counter() - start, 0.0)
            self._drop_corrupt(chunk, IntegrityError("its bytes do not match"))
            refetch_start = time.perf_counter()
            obj = self._get_stored(chunk)
            refetch_s = time.perf_counter() - refetch_start
            fetched = Fetched(
                chunk, Tier.STORE, obj, refetch_s, len(obj), page_offset=fetched.page_offset
            )
        assert fetched.obj is not None
        self._decode_verified(fetched.obj, chunk, dest)
        self._write_through(chunk, dest, fetched.page_offset)
        return Finished(Tier.STORE, time.perf_counter() - start - refetch_s, refetch_s)

    def load_into(self, chunk: ChunkRef, dest: memoryview) -> Tier:
        """Both stages in the calling thread."""
        return self.finish(self.fetch(chunk, dest), dest).tier

    # --- internals -----------------------------------------------------------
    def _cached_intact(self, fetched: Fetched, dest: memoryview) -> bool:
        """A hit's bytes against its recorded checksum; an older entry's (none recorded)
        against the digest, after which its entry is written again with a checksum."""
        if fetched.checksum is not None:
            return checksum_bytes(dest) == fetched.checksum
        if not _matches(dest, fetched.chunk):
            return False
        self._count(cache_rehashed=1)
        assert self.cache is not None
        try:
            self.cache.record(fetched.chunk.digest, dest, fetched.page_offset)
        except StoreError as exc:  # checked again with the digest next time
            self._count(cache_write_errors=1)
            log.warning("cached chunk %s not recorded: %s", fetched.chunk.digest, exc)
        return True

    def _get_stored(self, chunk: ChunkRef) -> bytes:
        obj = self.registry.get_chunk(chunk.digest)
        self._count(store_gets=1, store_bytes=len(obj))
        return obj

    def _decode_verified(self, obj: bytes, chunk: ChunkRef, dest: memoryview) -> None:
        try:
            codec.decode_into(obj, dest, chunk.size)
        except IntegrityError as exc:
            raise type(exc)(
                f"chunk {chunk.digest} from store {self.registry.store.url} is corrupt: {exc}; "
                "run `thaw models verify REF --delete-bad`, then push the artifact again"
            ) from exc
        if not _matches(dest, chunk):
            raise IntegrityError(
                f"chunk {chunk.digest} from store {self.registry.store.url} does not match its "
                "digest; the store is corrupt: run `thaw models verify REF --delete-bad`, then "
                "push the artifact again (a push skips chunks already stored)"
            )

    def _write_through(
        self, chunk: ChunkRef, verified: memoryview, page_offset: int | None
    ) -> None:
        # The decoded bytes, not the store's object: a hit is then one readinto, or a
        # mapping of the entry's pages.
        if self.cache is None:
            return
        try:
            self.cache.put_raw(chunk.digest, verified, page_offset=page_offset)
        except StoreError as exc:
            self._count(cache_write_errors=1)
            log.warning("chunk %s not cached: %s", chunk.digest, exc)

    def _drop_corrupt(self, chunk: ChunkRef, exc: Exception) -> None:
        assert self.cache is not None
        log.warning(
            "cached chunk %s is corrupt (%s); fetching it from the store", chunk.digest, exc
        )
        self.cache.drop(chunk.digest)
        self._count(cache_corrupt=1)


def _matches(dest: memoryview, chunk: ChunkRef) -> bool:
    return digest_bytes(dest) == chunk.digest
