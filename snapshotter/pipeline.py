"""The load pipeline: fetch pool -> decode/verify pool -> placer.

::

    main thread         fetch pool (I/O)             decode pool (CPU)
    for w in order:
      sem.acquire(w) -> target = placer.target(w)
                        fetched = source.fetch(w) -> source.finish(fetched)  # decode; check
                                                     placer.commit(w)        # copy / async H2D
                                                     sem.release(w)

Memory in flight is bounded by a byte semaphore: a chunk holds
``max(size, stored_size)`` (clamped to the cap, so one oversized chunk can
still pass alone) from before its fetch starts until it is placed. zstd and
blake3 release the GIL, so the decode pool runs truly in parallel.

On the first error no new chunk starts, every chunk already started runs to
its end (so no thread writes into a buffer after ``run_pipeline`` returns),
then the error is raised.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from snapshotter.config import LoaderConfig
from snapshotter.load_plan import ChunkWork
from snapshotter.source import ChunkSource, Fetched, Finished, Tier


@dataclass
class Target:
    """Where a chunk is decoded: ``view`` is exactly ``chunk.size`` bytes; ``map_pages``:
    it lies in a private mapping the placer owns, into which a cache hit's pages may be
    mapped (``snapshotter.cache.DiskCache.read_into``)."""

    view: memoryview
    handle: object = None
    map_pages: bool = False


class Placer(Protocol):
    def target(self, work: ChunkWork) -> Target: ...

    def commit(self, work: ChunkWork, target: Target) -> None:
        """Put the verified bytes in their places; the target may be reused after."""

    def abandon(self, work: ChunkWork, target: Target) -> None:
        """Release a target after a failure."""


class ByteSemaphore:
    """Counts bytes instead of slots; records the peak for the report."""

    def __init__(self, cap_bytes: int) -> None:
        if cap_bytes <= 0:
            raise ValueError(f"max_inflight_bytes must be positive, got {cap_bytes}")
        self.cap_bytes = cap_bytes
        self.inflight_bytes = 0
        self.peak_bytes = 0
        self._cond = threading.Condition()

    def weight(self, nbytes: int) -> int:
        return max(1, min(nbytes, self.cap_bytes))

    def acquire(self, nbytes: int, abort: Callable[[], bool]) -> bool:
        """Block until ``nbytes`` fit; False (nothing taken) when ``abort()`` turns true."""
        with self._cond:
            while self.inflight_bytes + nbytes > self.cap_bytes:
                if abort():
                    return False
                self._cond.wait(0.05)
            if abort():
                return False
            self.inflight_bytes += nbytes
            self.peak_bytes = max(self.peak_bytes, self.inflight_bytes)
            return True

    def release(self, nbytes: int) -> None:
        with self._cond:
            self.inflight_bytes -= nbytes
            self._cond.notify_all()


@dataclass
class StageTotals:
    """Summed over chunks; seconds are thread-busy seconds, not wall time."""

    chunks: int = 0
    fetch_s: float = 0.0
    fetch_bytes: int = 0
    decode_s: float = 0.0
    decode_bytes: int = 0
    place_s: float = 0.0
    place_bytes: int = 0
    cache_hit_bytes: int = 0
    cache_mapped_bytes: int = 0
    cache_hits: int = 0
    store_bytes: int = 0
    store_gets: int = 0
    peak_inflight_bytes: int = 0


class _Run:
    def __init__(self, source: ChunkSource, placer: Placer, sem: ByteSemaphore) -> None:
        self.source, self.placer, self.sem = source, placer, sem
        self.totals = StageTotals()
        self.error: BaseException | None = None
        self._pending = 0
        self._cond = threading.Condition()

    def failed(self) -> bool:
        return self.error is not None

    def started(self) -> None:
        with self._cond:
            self._pending += 1

    def done(self, weight: int, error: BaseException | None = None) -> None:
        self.sem.release(weight)
        with self._cond:
            if error is not None and self.error is None:
                self.error = error
            self._pending -= 1
            self._cond.notify_all()

    def wait_all(self) -> None:
        with self._cond:
            while self._pending:
                self._cond.wait()

    def record(self, work: ChunkWork, fetched: Fetched, finished: Finished, place_s: float) -> None:
        with self._cond:
            t = self.totals
            t.chunks += 1
            t.fetch_s += fetched.fetch_s + finished.refetch_s
            t.fetch_bytes += fetched.fetched_bytes
            t.decode_s += finished.decode_s
            t.decode_bytes += work.chunk.size
            t.place_s += place_s
            t.place_bytes += sum(p.nbytes for p in work.placements)
            if finished.tier is Tier.CACHE:
                t.cache_hits += 1
                t.cache_hit_bytes += work.chunk.size  # cache entries are raw
                t.cache_mapped_bytes += fetched.mapped_bytes
            else:
                t.store_gets += 1
                t.store_bytes += work.chunk.stored_size


def run_pipeline(
    work: Sequence[ChunkWork], source: ChunkSource, placer: Placer, config: LoaderConfig
) -> StageTotals:
    """Fetch, verify and place every chunk of ``work``; raises the first error."""
    sem = ByteSemaphore(config.max_inflight_bytes)
    run = _Run(source, placer, sem)
    with (
        ThreadPoolExecutor(max(1, config.fetch_threads), "thaw-fetch") as fetch_pool,
        ThreadPoolExecutor(max(1, config.decode_threads), "thaw-decode") as decode_pool,
    ):

        def decode(w: ChunkWork, target: Target, fetched: Fetched, weight: int) -> None:
            try:
                finished = source.finish(fetched, target.view)
                start = time.perf_counter()
                placer.commit(w, target)
                run.record(w, fetched, finished, time.perf_counter() - start)
            except BaseException as exc:
                placer.abandon(w, target)
                run.done(weight, exc)
                return
            run.done(weight)

        def fetch(w: ChunkWork, weight: int) -> None:
            if run.failed():
                run.done(weight)
                return
            target: Target | None = None
            try:
                target = placer.target(w)
                fetched = source.fetch(
                    w.chunk, target.view, page_offset=w.page_offset, map_pages=target.map_pages
                )
                decode_pool.submit(decode, w, target, fetched, weight)
            except BaseException as exc:
                if target is not None:
                    placer.abandon(w, target)
                run.done(weight, exc)

        for w in work:
            weight = sem.weight(max(w.chunk.size, w.chunk.stored_size))
            if not sem.acquire(weight, run.failed):
                break
            run.started()
            fetch_pool.submit(fetch, w, weight)
        run.wait_all()
    run.totals.peak_inflight_bytes = sem.peak_bytes
    if run.error is not None:
        raise run.error
    return run.totals
