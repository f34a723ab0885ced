"""Make files cold or warm in the kernel page cache, and measure which they are.

Cold means the next read goes to the device. Two ways to get there, tried in
order; the caller records which one worked:

1. ``sync`` then ``echo 1 > /proc/sys/vm/drop_caches``: drops every clean page
   on the machine (needs root, and a kernel that lets the container write it).
2. ``posix_fadvise(POSIX_FADV_DONTNEED)`` on every file involved, after
   ``fdatasync`` (dirty pages cannot be dropped): per file, no privilege needed.

Either way, ``resident_fraction`` (``mincore(2)``) checks the result instead
of trusting it.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from collections.abc import Iterable
from pathlib import Path

from snapshotter.pages import libc

DROP_CACHES = "drop_caches"
FADVISE = "fadvise"
_READ_BLOCK_BYTES = 8 << 20
_PAGE_BYTES = mmap.PAGESIZE


def _fadvise_dontneed(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def drop_page_cache(files: Iterable[Path], *, allow_global: bool = True) -> str:
    """Evict ``files`` from the page cache; return the way that worked.

    With ``allow_global`` the whole cache is dropped when the kernel allows it
    (then ``files`` are fadvised too, which costs nothing and covers a kernel
    that accepts the write but ignores it). Raises ``OSError`` only if fadvise
    itself fails.
    """
    paths = list(files)
    method = FADVISE
    if allow_global:
        os.sync()
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("1\n")
            method = DROP_CACHES
        except OSError:
            pass
    for p in paths:
        _fadvise_dontneed(p)
    return method


def warm_page_cache(files: Iterable[Path]) -> None:
    """Read every byte of ``files`` once so the next read is served from RAM."""
    buf = bytearray(_READ_BLOCK_BYTES)
    for p in files:
        with open(p, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


def _resident_pages(lib: ctypes.CDLL, path: Path) -> tuple[int, int]:
    size = path.stat().st_size
    if size == 0:
        return 0, 0
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = lib.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), f"mmap of {path} failed")
        try:
            n_pages = (size + _PAGE_BYTES - 1) // _PAGE_BYTES
            vec = (ctypes.c_ubyte * n_pages)()
            if lib.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore of {path} failed")
            return sum(b & 1 for b in vec), n_pages
        finally:
            lib.munmap(addr, size)
    finally:
        os.close(fd)


def resident_fraction(files: Iterable[Path]) -> float:
    """The fraction (0..1) of the files' pages now in the page cache; 0 for no bytes."""
    lib = libc()
    resident = total = 0
    for p in files:
        r, t = _resident_pages(lib, p)
        resident += r
        total += t
    return resident / total if total else 0.0
