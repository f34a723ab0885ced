"""Where the rate limiter keeps its token buckets.

- :class:`MemoryBuckets`: in this process's memory (one ``thaw server``
  process, or a test);
- :class:`SharedBuckets`: in a file of ``THAW_PEER_DIR`` mapped into each
  process of one ``thaw server --processes N``, as nginx's ``limit_req`` zone
  is shared by its workers. The kernel spreads connections over the
  processes; with buckets of their own, a client would get up to N times its
  limit.

The file is a table of fixed-size slots: a bucket's name digest, its tokens
and when it was last charged. A name is looked up in up to ``PROBE`` slots
from its hash; a new one takes the first empty slot there, or else the slot
charged longest ago (that bucket starts full again when next used: only when
more than about ``SLOTS`` buckets are in use at once can a client get past its
limit). One charge holds an exclusive ``flock`` on the file for the few
microseconds it takes, and the processes' clocks are the machine's one clock.
"""

from __future__ import annotations

import fcntl
import hashlib
import mmap
import os
import struct
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Protocol

Slot = tuple[str, str]  # ("key", key id) or ("function", name)
Saved = tuple[float, float]  # a bucket's tokens, and when it was last charged

_ENTRY = struct.Struct("<16sdd")  # name digest, tokens, updated_at
_EMPTY = bytes(16)
SLOTS = 16_384  # 512 KiB
PROBE = 16
ZONE_FILE = "ratelimit.zone"


class BucketTable(Protocol):
    def get(self, slot: Slot) -> Saved | None: ...

    def __setitem__(self, slot: Slot, saved: Saved) -> None: ...


class Buckets(Protocol):
    """What ``RateLimiter`` charges: buckets read and written within one ``charging()``,
    which no other charge (of any process sharing them) interleaves."""

    def charging(self) -> AbstractContextManager[BucketTable]: ...

    def close(self) -> None: ...


class MemoryBuckets:
    """The buckets of this process alone."""

    def __init__(self) -> None:
        self._buckets: dict[Slot, Saved] = {}
        self._lock = threading.Lock()

    @contextmanager
    def charging(self) -> Iterator[dict[Slot, Saved]]:
        with self._lock:
            yield self._buckets

    def close(self) -> None:
        pass


class SharedBuckets:
    """The buckets of every process that maps ``path`` (made, all empty, by the first)."""

    def __init__(self, path: Path) -> None:
        size = SLOTS * _ENTRY.size
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size < size:  # all of them may do this: the same size, zeros
                os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self._lock = threading.Lock()  # flock is per open file: this process's threads too

    @contextmanager
    def charging(self) -> Iterator[_Table]:
        with self._lock:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                yield _Table(self._map)
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        self._map.close()
        os.close(self._fd)


class _Table:
    """The mapped slots, while the file is locked."""

    def __init__(self, zone: mmap.mmap) -> None:
        self._zone = zone

    def get(self, slot: Slot) -> Saved | None:
        digest = _digest(slot)
        for i in _probe(digest):
            name, tokens, updated_at = _ENTRY.unpack_from(self._zone, i * _ENTRY.size)
            if name == digest:
                return tokens, updated_at
            if name == _EMPTY:
                return None
        return None

    def __setitem__(self, slot: Slot, saved: Saved) -> None:
        digest = _digest(slot)
        oldest, oldest_at = -1, float("inf")
        for i in _probe(digest):
            name, _, updated_at = _ENTRY.unpack_from(self._zone, i * _ENTRY.size)
            if name in (digest, _EMPTY):
                oldest = i
                break
            if updated_at < oldest_at:
                oldest, oldest_at = i, updated_at
        _ENTRY.pack_into(self._zone, oldest * _ENTRY.size, digest, *saved)


def _digest(slot: Slot) -> bytes:
    digest = hashlib.blake2b(f"{slot[0]}\0{slot[1]}".encode(), digest_size=16).digest()
    return digest if digest != _EMPTY else b"\1" + digest[1:]


def _probe(digest: bytes) -> range:
    """The ``PROBE`` slots a name may be in, from its hash on."""
    start = int.from_bytes(digest[:8], "little") % (SLOTS - PROBE + 1)
    return range(start, start + PROBE)
