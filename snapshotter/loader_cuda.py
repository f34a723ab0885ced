"""The CUDA half of the loader: pinned staging ring and async copies.

::

    fetch pool:   slot = pool.acquire(chunk.size)      # pinned host memory
                  cache hit (raw) -> readinto slot / store get
    decode pool:  decode into slot, check slot          # on the host: blake3 for a store
                                                        # object, xxh3 for a cache hit
                  with copy_stream: dev_buf[...].copy_(slot[...], non_blocking=True)
                  event.record(copy_stream); pool.release_after(slot, event)
    end:          copy_stream.synchronize()

Slots return to the pool only when the event of their last copy has
completed, so a slot is never overwritten while the GPU still reads it.
The pool is allocated once (``Snapshotter.prewarm(device)`` lets a pre-warmed
process do it before any request) and reused by every later load. A chunk
larger than a slot gets a one-off pinned buffer, dropped after its copy.

``copy_to_device`` takes a RAM-tier hit to the device. The hit's mappings are
read-only and shared (``snapshotter.ram_tier``), so they can be registered as
pinned host memory in place (``cudaHostRegister`` with ``ReadOnly``: the
kernel pins the tier's own pages, copying none) and copied straight to the
device with no staging hop; unregistered once the copies are done. It works
by pieces (the tier's checksummed pieces), a thread each up to the CPUs:
populate, check, register, copy, so the host's work on one piece overlaps
the DMA of others. Where the driver refuses to register them, they go
through the same pool as chunks. The loader hands it to ``loader_ram``.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Sequence

import torch

from snapshotter.config import LoaderConfig
from snapshotter.fanout import run_each
from snapshotter.load_plan import ChunkWork
from snapshotter.load_types import PieceCheck, Pieces
from snapshotter.pipeline import Target

_MIN_SLOTS = 2
# cudaHostRegisterReadOnly (CUDA 11.1+): pin pages the process may only read, such as the
# RAM tier's PROT_READ mappings; a registration without it asks for write access and fails.
_HOST_REGISTER_READ_ONLY = 0x08

log = logging.getLogger(__name__)


def staging_shape(config: LoaderConfig) -> tuple[int, int]:
    """(slot bytes, slot count) for a config: chunk-sized slots covering the in-flight cap."""
    slot_bytes = config.chunk_size_bytes
    return slot_bytes, max(_MIN_SLOTS, config.max_inflight_bytes // slot_bytes)


class StagingPool:
    """Pinned host buffers, recycled by CUDA events. Thread-safe."""

    def __init__(self, slot_bytes: int, slots: int) -> None:
        self.slot_bytes = slot_bytes
        self._slots = [
            torch.empty(slot_bytes, dtype=torch.uint8, pin_memory=True) for _ in range(slots)
        ]
        self._owned = {id(s) for s in self._slots}
        self._free = list(self._slots)
        self._pending: collections.deque[tuple[torch.cuda.Event, torch.Tensor]] = (
            collections.deque()
        )
        self._cond = threading.Condition()

    @property
    def slots(self) -> int:
        return len(self._slots)

    def acquire(self, nbytes: int) -> torch.Tensor:
        """A pinned buffer of at least ``nbytes``; blocks while every slot is busy."""
        if nbytes > self.slot_bytes:
            return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        while True:
            with self._cond:
                self._reap()
                if self._free:
                    return self._free.pop()
                oldest = self._pending[0] if self._pending else None
                if oldest is None:
                    self._cond.wait()
                    continue
            # Wait for the oldest copy outside the lock, then retry.
            oldest[0].synchronize()

    def release_after(self, slot: torch.Tensor, event: torch.cuda.Event) -> None:
        """Give ``slot`` back once ``event`` (its last copy) has completed."""
        if id(slot) not in self._owned:
            return  # one-off buffer: the caching host allocator frees it after the copy
        with self._cond:
            self._pending.append((event, slot))
            self._cond.notify_all()

    def release(self, slot: torch.Tensor) -> None:
        """Give back a slot no copy reads (after a failure)."""
        if id(slot) not in self._owned:
            return
        with self._cond:
            self._free.append(slot)
            self._cond.notify_all()

    def _reap(self) -> None:
        while self._pending and self._pending[0][0].query():
            self._free.append(self._pending.popleft()[1])


class CudaPlacer:
    """Decode into pinned staging slots; copy to the device buffers on a copy stream."""

    def __init__(self, buffers: list[torch.Tensor], pool: StagingPool) -> None:
        self._buffers = buffers
        self._pool = pool
        device = next((b.device for b in buffers), torch.device("cuda"))
        self._stream = torch.cuda.Stream(device=device)
        # The buffers were allocated on the current stream; copies must follow that.
        self._stream.wait_stream(torch.cuda.current_stream(device))

    def target(self, work: ChunkWork) -> Target:
        slot = self._pool.acquire(work.chunk.size)
        return Target(slot.numpy().data[: work.chunk.size], slot)

    def commit(self, work: ChunkWork, target: Target) -> None:
        slot = target.handle
        assert isinstance(slot, torch.Tensor)
        with torch.cuda.stream(self._stream):
            for p in work.placements:
                dest = self._buffers[p.file_idx][p.dest_begin : p.dest_begin + p.nbytes]
                dest.copy_(slot[p.src_begin : p.src_end], non_blocking=True)
            event = torch.cuda.Event()
            event.record(self._stream)
        self._pool.release_after(slot, event)

    def abandon(self, work: ChunkWork, target: Target) -> None:
        slot = target.handle
        assert isinstance(slot, torch.Tensor)
        self._pool.release(slot)

    def finish(self) -> float:
        """Wait for every copy; returns the seconds spent waiting."""
        start = time.perf_counter()
        self._stream.synchronize()
        return time.perf_counter() - start


def copy_to_device(
    host: Sequence[torch.Tensor],
    dev: torch.device,
    pool: StagingPool,
    pieces: Pieces | None = None,
    check: PieceCheck | None = None,
) -> tuple[list[torch.Tensor], float]:
    """Copy host buffers (a RAM-tier hit) to new device buffers; returns (device buffers,
    seconds), every copy completed.

    ``pieces`` (per buffer, its ``[begin, end)`` ranges; default: each buffer
    whole) go at once, a thread each up to the CPUs: ``check`` runs on a piece,
    then the piece is registered in place as pinned memory and copied with its
    own DMA, so checking one piece overlaps copying others and no piece reaches
    the device unchecked. Where the driver refuses to register, every piece is
    checked, then copied through the pool's pinned slots.
    """
    start = time.perf_counter()
    pieces = _whole(host) if pieces is None else pieces
    out = copy_registered(host, dev, pieces, check)
    if out is None:
        if check is not None:
            _each_piece(pieces, check)
        out = _copy_staged(host, dev, pool)
    return out, time.perf_counter() - start


def copy_registered(
    host: Sequence[torch.Tensor],
    dev: torch.device,
    pieces: Pieces | None = None,
    check: PieceCheck | None = None,
) -> list[torch.Tensor] | None:
    """``copy_to_device`` with every piece registered (read-only) as pinned memory and
    unregistered after its copy; None when the driver refuses a registration
    (tried on the first piece: nothing copied then, nothing left registered).

    The buffers must stay mapped until this returns.
    """
    pieces = _whole(host) if pieces is None else pieces
    first = next(((i, b, e) for i, ranges in enumerate(pieces) for b, e in ranges), None)
    if first is not None and not _registrable(host[first[0]][first[1] : first[2]]):
        return None
    out = [torch.empty(src.numel(), dtype=torch.uint8, device=dev) for src in host]
    # The buffers were allocated on the current stream; every copy must follow that.
    torch.cuda.current_stream(dev).synchronize()
    streams = threading.local()

    def copy(i: int, begin: int, end: int) -> None:
        if check is not None:
            check(i, begin, end)
        stream = getattr(streams, "stream", None)
        if stream is None:
            stream = streams.stream = torch.cuda.Stream(device=dev)
        src, dst = host[i][begin:end], out[i][begin:end]
        registered = register_read_only(src)
        try:
            with torch.cuda.stream(stream):
                dst.copy_(src, non_blocking=registered)
            stream.synchronize()
        finally:
            if registered:
                unregister(src.data_ptr())

    _each_piece(pieces, copy)
    return out


def _each_piece(pieces: Pieces, run: PieceCheck) -> None:
    """``run(i, begin, end)`` for every piece, at once (``snapshotter.fanout``)."""
    tasks = [(i, b, e) for i, ranges in enumerate(pieces) for b, e in ranges]
    run_each(tasks, lambda task: run(*task), "thaw-h2d")


def _whole(host: Sequence[torch.Tensor]) -> Pieces:
    """Each buffer as one piece."""
    return [[(0, src.numel())] if src.numel() else [] for src in host]


def _registrable(src: torch.Tensor) -> bool:
    """Whether the driver pins ``src`` (registered and at once unregistered)."""
    if not register_read_only(src):
        log.info("host buffers not registered; copying through staging")
        return False
    unregister(src.data_ptr())
    return True


def register_read_only(src: torch.Tensor) -> bool:
    """Pin ``src`` in place, read-only; False (the error cleared) when refused. A
    refusal after a first success leaves that piece pageable: the driver stages it."""
    cudart = torch.cuda.cudart()
    err = cudart.cudaHostRegister(src.data_ptr(), src.numel(), _HOST_REGISTER_READ_ONLY)
    if err != cudart.cudaError.success:
        _clear_cuda_error()
        return False
    return True


def unregister(ptr: int) -> None:
    """Undo ``register_read_only`` of the memory at ``ptr``."""
    torch.cuda.cudart().cudaHostUnregister(ptr)


def _clear_cuda_error() -> None:
    """Reset the runtime's last error after a refused registration: torch checks
    ``cudaGetLastError`` after each kernel launch and would blame an unrelated kernel.
    torch's ``cudart`` module does not bind it; the process's libcudart does."""
    import ctypes

    try:
        ctypes.CDLL(None).cudaGetLastError()
    except (OSError, AttributeError):  # libcudart not global: torch may report it later
        log.warning("could not clear the CUDA error of a refused host registration")


def _copy_staged(
    host: Sequence[torch.Tensor], dev: torch.device, pool: StagingPool
) -> list[torch.Tensor]:
    """Copy pageable host buffers to new device buffers through pinned slots.

    A pageable source would make the driver stage through its own small
    pinned buffer synchronously; the loader's slot ring lets the host memcpy
    of one slot overlap the DMA of the previous ones.
    """
    out = [torch.empty(src.numel(), dtype=torch.uint8, device=dev) for src in host]
    stream = torch.cuda.Stream(device=dev)
    # The buffers were allocated on the current stream; the copies must follow that.
    stream.wait_stream(torch.cuda.current_stream(dev))
    for src, dst in zip(host, out, strict=True):
        for begin in range(0, src.numel(), pool.slot_bytes):
            nbytes = min(pool.slot_bytes, src.numel() - begin)
            slot = pool.acquire(nbytes)
            slot[:nbytes].copy_(src[begin : begin + nbytes])
            with torch.cuda.stream(stream):
                dst[begin : begin + nbytes].copy_(slot[:nbytes], non_blocking=True)
                event = torch.cuda.Event()
                event.record(stream)
            pool.release_after(slot, event)
    stream.synchronize()
    return out
