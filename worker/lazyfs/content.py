"""File contents on demand: chunks fetched on first read, kept in RAM, recorded in order.

``ContentReader.read(entry, offset, size)`` returns the bytes of a file
range, fetching the chunks that cover it through a ``ChunkSource`` (the
worker's disk chunk cache in front of the store; every chunk verified
against its digest before use). Fetched chunks stay in a RAM tier capped at
``memory_bytes`` (least recently used dropped first), so the kernel's many
small reads of one chunk cost one fetch. Two readers wanting the same chunk
wait for one fetch.

``AccessRecorder`` keeps the order in which files were first read, until
``freeze`` (the runtime calls it at the replica's first output): that order
is the image's prefetch profile.

``Prefetcher`` fetches a profile's files, in the profile's order, on a pool
of threads; the order files were *started* in is kept for inspection.

All three are thread-safe; the FUSE loop calls them from worker threads.
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from snapshotter.layers import TocEntry
from snapshotter.manifest import ChunkRef
from snapshotter.source import ChunkSource

DEFAULT_MEMORY_BYTES = 512 << 20


class AccessRecorder:
    """First-read order of file paths, while recording."""

    def __init__(self, recording: bool = True) -> None:
        self._lock = threading.Lock()
        self._seen: set[str] = set()
        self._order: list[str] = []
        self._recording = recording

    def record(self, path: str) -> None:
        if path in self._seen:  # racy fast path is fine: re-checked under the lock
            return
        with self._lock:
            if path in self._seen:
                return
            self._seen.add(path)
            if self._recording:
                self._order.append(path)

    def freeze(self) -> list[str]:
        """Stop recording; return the order so far (idempotent)."""
        with self._lock:
            self._recording = False
            return list(self._order)

    def order(self) -> list[str]:
        with self._lock:
            return list(self._order)

    @property
    def files_read(self) -> int:
        with self._lock:
            return len(self._seen)


@dataclass
class ReadCounters:
    bytes_served: int = 0
    chunks_fetched: int = 0
    memory_hits: int = 0


class ContentReader:
    """Serves file ranges from chunks; see the module docstring."""

    def __init__(self, source: ChunkSource, memory_bytes: int = DEFAULT_MEMORY_BYTES) -> None:
        self.source = source
        self.memory_bytes = memory_bytes
        self.counters = ReadCounters()
        self._lock = threading.Lock()
        self._memory: OrderedDict[str, bytes] = OrderedDict()
        self._memory_used = 0
        self._inflight: dict[str, threading.Event] = {}

    def read(self, entry: TocEntry, offset: int, size: int) -> bytes:
        """Bytes ``[offset, offset+size)`` of ``entry``, short at end of file."""
        end = min(entry.size, offset + size)
        if offset >= end:
            return b""
        chunks = entry.chunks
        first = bisect.bisect_right([c.offset for c in chunks], offset) - 1
        parts = []
        for chunk in chunks[first:]:
            if chunk.offset >= end:
                break
            data = self.chunk(chunk)
            parts.append(data[max(0, offset - chunk.offset) : end - chunk.offset])
        out = b"".join(parts)
        with self._lock:
            self.counters.bytes_served += len(out)
        return out

    def chunk(self, chunk: ChunkRef) -> bytes:
        """One chunk's verified bytes, from RAM or fetched once."""
        while True:
            with self._lock:
                data = self._memory.get(chunk.digest)
                if data is not None:
                    self._memory.move_to_end(chunk.digest)
                    self.counters.memory_hits += 1
                    return data
                waiting = self._inflight.get(chunk.digest)
                if waiting is None:
                    done = self._inflight[chunk.digest] = threading.Event()
                    break
            waiting.wait()  # someone else fetches it; then look again
        try:
            buf = bytearray(chunk.size)
            self.source.load_into(chunk, memoryview(buf))
            data = bytes(buf)
            self._remember(chunk.digest, data)
            return data
        finally:
            with self._lock:
                del self._inflight[chunk.digest]
            done.set()

    def prefetch(self, entry: TocEntry) -> None:
        for chunk in entry.chunks:
            self.chunk(chunk)

    def _remember(self, digest: str, data: bytes) -> None:
        with self._lock:
            self.counters.chunks_fetched += 1
            if len(data) > self.memory_bytes:
                return
            self._memory[digest] = data
            self._memory_used += len(data)
            while self._memory_used > self.memory_bytes:
                _, old = self._memory.popitem(last=False)
                self._memory_used -= len(old)


class Prefetcher:
    """Fetches files in a given order on ``threads`` threads (FIFO: started in order)."""

    def __init__(self, reader: ContentReader, threads: int = 8) -> None:
        self.reader = reader
        self._pool = ThreadPoolExecutor(max(1, threads), thread_name_prefix="thaw-prefetch")
        self._lock = threading.Lock()
        self._started: list[str] = []
        self._futures: list[Future[None]] = []

    def submit(self, entries: Iterable[TocEntry]) -> None:
        for entry in entries:
            self._futures.append(self._pool.submit(self._fetch, entry))

    def _fetch(self, entry: TocEntry) -> None:
        with self._lock:
            self._started.append(entry.path)
        self.reader.prefetch(entry)

    def started(self) -> list[str]:
        with self._lock:
            return list(self._started)

    @property
    def done(self) -> bool:
        return all(f.done() for f in self._futures)

    def errors(self) -> list[str]:
        return [str(f.exception()) for f in self._futures if f.done() and f.exception()]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
