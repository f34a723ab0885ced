"""Host memory for CPU loads, faulted in before the load needs it.

The first write to freshly allocated memory costs a page fault and the
kernel zeroing the page: for a 164 MB model about 80-100 ms on two cores,
as long as reading its chunks from the page cache and verifying them. A
pooled replica process waits idle before its cold start, so it maps an
arena of the size its worker expects and has the kernel populate it then
(``MAP_POPULATE``). The load carves each file's buffer out of the arena
(a bump allocator); once the start is done, the pages it did not use are
given back to the kernel.

The tensors carved out keep the whole mapping alive (``torch.frombuffer``
holds a reference); the tail given back costs nothing while they live.
"""

from __future__ import annotations

import mmap

import torch

ALIGN_BYTES = 4096  # every buffer starts on a page: any dtype's alignment holds


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def arena_bytes(sizes: list[int]) -> int:
    """What an arena needs to hold buffers of ``sizes`` (each starts on a page)."""
    return sum(_round_up(n, ALIGN_BYTES) for n in sizes)


class HostArena:
    """``nbytes`` of populated anonymous memory handed out front to back."""

    def __init__(self, nbytes: int) -> None:
        if nbytes <= 0:
            raise ValueError(f"a host arena needs a positive size, got {nbytes}")
        self.size = _round_up(nbytes, mmap.PAGESIZE)
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
        self._map = mmap.mmap(-1, self.size, flags=flags)
        self._all = torch.frombuffer(self._map, dtype=torch.uint8)
        self._used = 0
        self._end = self.size  # lowered when the tail is given back

    @property
    def free_bytes(self) -> int:
        return max(0, self._end - _round_up(self._used, ALIGN_BYTES))

    @property
    def used_bytes(self) -> int:
        return self._used

    def take(self, nbytes: int) -> torch.Tensor | None:
        """A uint8 tensor of ``nbytes`` from the arena, or None when it does not fit."""
        start = _round_up(self._used, ALIGN_BYTES)
        if nbytes < 0 or start + nbytes > self._end:
            return None
        self._used = start + nbytes
        return self._all[start : start + nbytes]

    def give_back_rest(self) -> int:
        """Return the pages nothing was carved from to the kernel; the bytes given back.
        Nothing more can be taken afterwards."""
        start = _round_up(self._used, mmap.PAGESIZE)
        rest = self._end - start
        self._end = min(self._end, start)
        if rest > 0:
            self._map.madvise(mmap.MADV_DONTNEED, start, rest)
        return max(0, rest)
