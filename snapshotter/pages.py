"""Page-level memory calls that Python's ``mmap`` module lacks: populate a range for
reading, and map a file's pages over part of a mapping this process owns.

Used by the RAM tier (populate its mappings) and by the disk cache (map an
entry's page-cache pages into a load's buffer instead of copying them). No
policy here: the callers decide when a range may be replaced.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import mmap
import os

import torch

PAGE_BYTES = mmap.PAGESIZE
# Linux's values; Python 3.11's mmap module names neither.
MAP_FIXED = getattr(mmap, "MAP_FIXED", 0x10)
# madvise(2): fault a range's pages in for reading, in one call (Linux 5.14+).
MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)
_MAP_FAILED = ctypes.c_void_p(-1).value


def round_down(n: int) -> int:
    return n - n % PAGE_BYTES


def round_up(n: int) -> int:
    return -(-n // PAGE_BYTES) * PAGE_BYTES


def address_of(view: memoryview) -> int:
    """Where a writable, non-empty byte view starts in this process's memory."""
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


def populate_read(address: int, nbytes: int) -> bool:
    """Map every page of ``[address, address + nbytes)`` now, for reading, in one call
    (no copy, and no copy-on-write break on a private mapping). False where the kernel
    cannot (before 5.14): the pages then fault in on first use. Raises ``OSError``
    when a page cannot be read (its file is shorter than the mapping)."""
    if nbytes <= 0:
        return True
    if libc().madvise(ctypes.c_void_p(address), ctypes.c_size_t(nbytes), MADV_POPULATE_READ):
        err = ctypes.get_errno()
        if err in (errno.EINVAL, errno.ENOSYS):
            return False
        raise OSError(err, os.strerror(err))
    return True


def map_file_over(address: int, nbytes: int, fd: int, file_offset: int) -> None:
    """Replace the pages ``[address, address + nbytes)`` of a mapping this process owns
    with a private, writable mapping of ``fd``'s bytes from ``file_offset`` (all three
    page-aligned). A write then copies the page it touches (copy-on-write); the file is
    never changed.

    Raises ``OSError`` when the kernel refuses (a filesystem without mmap, say); the
    range then holds fresh zeroed anonymous pages again, so the caller can fill it
    another way. The caller must own the range: whatever was mapped there is gone.
    """
    if address % PAGE_BYTES or nbytes % PAGE_BYTES or file_offset % PAGE_BYTES:
        raise ValueError(f"unaligned mapping: {address:#x} + {nbytes} from {file_offset}")
    flags = mmap.MAP_PRIVATE | MAP_FIXED
    got = _mmap(address, nbytes, flags, fd, file_offset)
    if got == address:
        return
    err = ctypes.get_errno()
    # A failed MAP_FIXED may already have unmapped the range: put anonymous pages back
    # so the buffer has no hole (a write to a hole is SIGSEGV).
    anonymous_over(address, nbytes)
    raise OSError(err, f"cannot map a file over a buffer: {os.strerror(err)}")


def anonymous_over(address: int, nbytes: int) -> None:
    """Replace ``[address, address + nbytes)`` (page-aligned, owned by the caller) with
    fresh zeroed private anonymous pages, dropping whatever was mapped there."""
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_FIXED
    if _mmap(address, nbytes, flags, -1, 0) != address:
        raise MemoryError(f"cannot restore {nbytes} bytes of a load buffer at {address:#x}")


def anonymous_buffer(nbytes: int) -> torch.Tensor:
    """A CPU uint8 tensor of ``nbytes`` over its own private anonymous mapping (page-aligned,
    not populated): ranges of it may be replaced with ``map_file_over``. The tensor keeps
    the mapping alive (``torch.frombuffer`` holds it); unmapping it unmaps what was mapped
    over it too."""
    if nbytes == 0:
        return torch.empty(0, dtype=torch.uint8)
    region = mmap.mmap(-1, round_up(nbytes), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(region, dtype=torch.uint8)[:nbytes]


def _mmap(address: int, nbytes: int, flags: int, fd: int, offset: int) -> int | None:
    prot = mmap.PROT_READ | mmap.PROT_WRITE
    got = libc().mmap(address, nbytes, prot, flags, fd, offset)
    return None if got == _MAP_FAILED else got


@functools.cache
def libc() -> ctypes.CDLL:
    """The C library with the page calls' signatures declared (``mmap``, ``munmap``,
    ``madvise``, ``mincore``); errors in ``ctypes.get_errno()``."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.mmap.restype = ctypes.c_void_p
    return libc
