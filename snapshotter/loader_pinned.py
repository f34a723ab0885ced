"""The RAM tier pinned ahead, in a CUDA process that waits for its load.

Registering host memory with the driver (``cudaHostRegister``) costs more than
the copy it speeds up: on an H100 a 1 GiB load from the tier spent 0.10 s
pinning the tier's pages (16 threads) and 0.02 s copying them. Checking the
bytes on the host as they are copied costs too: the check reads every byte a
second time, and the two reads share the host's memory bandwidth (1 GiB checked
and copied in 28 ms against 20 ms copied alone, ``bench/h2d_sources.py``). A pool
process that will load to a GPU pays neither on the request's path::

    Snapshotter.prewarm(cuda) -> PinnedTier.start(): a thread holds every entry, the
                                 most recently used first: maps it read-only and
                                 shared, registers each piece, checks it against the
                                 tier's checksum (xxh3) and takes its device sums
                                 (snapshotter.piece_sums); then refreshes every
                                 interval_s: new entries held, evicted or replaced
                                 ones released
    load(ref, cuda)           -> stop refreshing (the process is becoming a replica);
                                 place_pinned: the hold, if its files are still the
                                 entry's; every piece copied on one stream, its sums
                                 taken on the device and compared with the hold's
    give_back_host_memory()   -> PinnedTier.close(): every hold released (the
                                 replica's weights are on the device by then)

The holds are made off the caller's thread: a process started for a request (a pool
miss) loads at once, unpinned if its entry is not held yet, and pins nothing more.

Every load still checks every byte, on the device, before a tensor sees it: the held
pages are the tier's own, so a byte damaged in ``/dev/shm`` after the hold is caught,
the entry dropped and the load served from the disk cache. The sums compared were
taken from bytes just proved against the checksums recorded at insert. A hold keeps
its entry's pages in memory while it lives, evicted from the tier or not, so it lives
at most ``interval_s`` past its entry (and not past the process's first load). Entries
from an older thaw (no checksums) are not held. Where the driver refuses a
registration, nothing is held and loads go the unpinned way (``snapshotter.loader_cuda``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from snapshotter.fanout import run_each
from snapshotter.load_plan import LoadPlan
from snapshotter.loader_cuda import register_read_only, unregister
from snapshotter.loader_ram import HeldLoad
from snapshotter.piece_sums import piece_sums
from snapshotter.pipeline import StageTotals
from snapshotter.ram_tier import RamTier
from snapshotter.ram_tier_entry import (
    PIECE_BYTES,
    BadEntry,
    TierFile,
    bytes_view,
    check_piece,
    map_all,
    read_meta,
)

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 1.0


@dataclass
class Hold:
    """An entry mapped read-only and registered as pinned memory, piece by piece."""

    digest: str
    files: list[TierFile]
    buffers: list[torch.Tensor]
    inodes: tuple[tuple[int, int], ...]  # (inode, size) of each data file mapped
    registered: list[int] = field(default_factory=list)  # pointers to unregister
    # (s1, s2) of every piece in order, on the device (snapshotter.piece_sums), taken
    # from bytes just checked against the tier's checksums; None with verify off
    sums: torch.Tensor | None = None
    users: int = 0
    stale: bool = False  # released once its last user is done

    @property
    def nbytes(self) -> int:
        return sum(f.data_bytes for f in self.files)


class PinnedTier:
    """One process's holds of the RAM tier's entries, for loads to CUDA. Thread-safe."""

    def __init__(
        self, tier: RamTier, device: torch.device, interval_s: float = DEFAULT_INTERVAL_S
    ) -> None:
        self.tier = tier
        self.device = device
        self.interval_s = interval_s
        self._holds: dict[str, Hold] = {}
        self._lock = threading.Lock()  # the holds
        self._refused = False
        self._stop = threading.Event()
        self._ready = threading.Event()  # the first refresh is done
        self._thread: threading.Thread | None = None
        self._sum_stream: torch.cuda.Stream | None = None

    def start(self) -> None:
        """Hold every entry, then keep the holds fresh, from a thread."""
        self._thread = threading.Thread(target=self._run, name="thaw-tier-pin", daemon=True)
        self._thread.start()

    def wait_ready(self, timeout_s: float | None = None) -> bool:
        """Wait until every entry there was at the start is held (or found unholdable)."""
        return self._ready.wait(timeout_s)

    def stop_refreshing(self) -> None:
        """Hold nothing more (what is held stays, until ``close``)."""
        self._stop.set()

    def held(self) -> dict[str, int]:
        """Manifest digest -> bytes held now."""
        with self._lock:
            return {d: h.nbytes for d, h in self._holds.items() if not h.stale}

    def refresh(self) -> None:
        """Release the holds whose entry is gone or replaced; hold the entries not held."""
        recent = self.tier.recent()
        with self._lock:
            for hold in list(self._holds.values()):
                if hold.digest not in recent or not self._current(hold):
                    self._retire(hold)
        for digest in recent:
            with self._lock:
                if self._refused or self._stop.is_set():
                    return
                if digest in self._holds:
                    continue
            new = self._hold(digest)  # registering takes a while: not under the lock
            if new is None:
                continue
            with self._lock:
                if self._stop.is_set() or digest in self._holds:
                    _release(new)
                    return
                self._holds[digest] = new

    @contextmanager
    def use(self, digest: str, plan: LoadPlan) -> Iterator[Hold | None]:
        """The hold of ``digest`` while the caller copies from it, if its files are still
        the entry's and match the plan's; None otherwise."""
        with self._lock:
            hold = self._holds.get(digest)
            if hold is not None and not self._current(hold):
                self._retire(hold)
                hold = None
            shapes = [(f.path, f.data_bytes) for f in plan.files]
            if hold is not None and [(f.path, f.data_bytes) for f in hold.files] != shapes:
                hold = None
            if hold is not None:
                hold.users += 1
        try:
            yield hold
        finally:
            if hold is not None:
                with self._lock:
                    hold.users -= 1
                    if hold.stale and hold.users == 0:
                        _release(hold)

    def drop(self, digest: str) -> None:
        """Release the hold of an entry found corrupt."""
        with self._lock:
            hold = self._holds.get(digest)
            if hold is not None:
                self._retire(hold)

    def close(self) -> None:
        """Stop refreshing and release every hold (those in use when their use ends)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        with self._lock:
            for hold in list(self._holds.values()):
                self._retire(hold)

    # --- internals ---------------------------------------------------------------
    def sum_stream(self) -> torch.cuda.Stream:
        """The stream a load's device sums run on, beside its copies."""
        with self._lock:
            if self._sum_stream is None:
                self._sum_stream = torch.cuda.Stream(device=self.device)
            return self._sum_stream

    def _warm_kernels(self) -> None:
        """Launch the device sums and their comparison once, on a probe the shape of a
        piece and of a file's last piece. A fresh process loads each CUDA kernel at its
        first launch (lazy module loading): about 0.1 s for these on an H100, which
        would otherwise fall on the load."""
        if self.device.type != "cuda" or not self.tier.config.verify:
            return
        probe = torch.zeros(PIECE_BYTES + 13, dtype=torch.uint8, device=self.device)
        with torch.cuda.stream(self.sum_stream()):
            rows = [
                piece_sums(probe, [p]) for p in ((0, PIECE_BYTES), (PIECE_BYTES, probe.numel()))
            ]
            got = torch.cat(rows)
            (got != got).any(dim=1).nonzero().flatten().tolist()

    def _run(self) -> None:
        try:
            self._warm_kernels()
        except Exception:  # only the first load is slower
            log.exception("warming the device-sum kernels failed")
        while True:
            try:
                self.refresh()
            except Exception:  # the holds are an optimization: loads go on without them
                log.exception("refreshing the pinned RAM tier failed")
            self._ready.set()
            if self._stop.wait(self.interval_s):
                return

    def _hold(self, digest: str) -> Hold | None:
        """The entry mapped and registered, or None (gone, unholdable, or refused)."""
        entry = self.tier.entry_dir(digest)
        try:
            meta = read_meta(entry)
            if meta is None or any(f.checksums is None for f in meta):
                return None  # evicted meanwhile, or an older entry checked whole by loads
            inodes = _inodes(entry, meta)
            buffers = map_all(entry, meta, read_only=True)
            if buffers is None or inodes is None or _inodes(entry, meta) != inodes:
                return None  # evicted or replaced while mapped: the next refresh sees it
        except (BadEntry, OSError):
            return None  # a load finds it bad and drops it
        hold = Hold(digest, meta, buffers, inodes)
        tasks = [(i, b, e) for i, f in enumerate(meta) for b, e in f.pieces()]
        views = [bytes_view(b) for b in buffers]
        verify = self.tier.config.verify
        sums: list[torch.Tensor | None] = [None] * len(tasks)
        lock = threading.Lock()
        refused: list[int] = []

        def hold_piece(n: int) -> None:
            i, begin, end = tasks[n]
            src = buffers[i][begin:end]
            ok = register_read_only(src)
            with lock:
                (hold.registered if ok else refused).append(src.data_ptr())
            if ok and verify:  # proved against the checksum recorded at insert, then summed
                check_piece(meta[i], views[i], begin, end)
                sums[n] = piece_sums(buffers[i], [(begin, end)])

        start = time.perf_counter()
        try:
            run_each(range(len(tasks)), hold_piece, "thaw-tier-pin")
        except BadEntry as exc:
            _release(hold)
            self.tier.corrupt(digest, str(exc))
            return None
        if refused:
            _release(hold)
            with self._lock:
                if not self._holds:
                    self._refused = True
                    log.info("the driver refuses to pin the RAM tier's pages; loads pin them")
            return None
        if verify:
            hold.sums = torch.cat([s for s in sums if s is not None]).to(self.device)
        log.info(
            "pinned RAM tier entry %s: %.0f MB in %.3f s",
            digest,
            hold.nbytes / 1e6,
            time.perf_counter() - start,
        )
        return hold

    # --- under the lock ------------------------------------------------------------
    def _current(self, hold: Hold) -> bool:
        return _inodes(self.tier.entry_dir(hold.digest), hold.files) == hold.inodes

    def _retire(self, hold: Hold) -> None:
        del self._holds[hold.digest]
        hold.stale = True
        if hold.users == 0:
            _release(hold)


def _inodes(
    entry: os.PathLike[str], files: Sequence[TierFile]
) -> tuple[tuple[int, int], ...] | None:
    """(inode, size) of each data file ((0, 0) for a file with no data), or None when one
    is gone. A replaced entry has new inodes; a truncated file, a new size (its pages
    past the end would fault)."""
    out = []
    for i, f in enumerate(files):
        if f.data_bytes == 0:
            out.append((0, 0))
            continue
        try:
            st = os.stat(os.path.join(entry, f"{i}.data"))
        except OSError:
            return None
        out.append((st.st_ino, st.st_size))
    return tuple(out)


def _release(hold: Hold) -> None:
    for ptr in hold.registered:
        unregister(ptr)
    hold.registered.clear()
    hold.buffers.clear()  # the mappings go with their last tensor


def place_pinned(
    pinned: PinnedTier, digest: str, plan: LoadPlan, dev: torch.device
) -> HeldLoad | None:
    """The plan's buffers on ``dev`` from a hold, or None when ``digest`` is not held (or
    a piece failed its check: the entry is then dropped, and the load goes on from the
    disk cache).

    Stage totals: fetch none (the mapping was made ahead), place = the checks and
    copies together, as for an unpinned hit.
    """
    start = time.perf_counter()
    tier = pinned.tier
    with pinned.use(digest, plan) as hold:
        if hold is None:
            return None
        try:
            buffers = _copy(hold, dev, pinned.sum_stream())
        except BadEntry as exc:
            pinned.drop(digest)
            tier.corrupt(digest, str(exc))
            return None
        except Exception:  # the hold is an optimization: the load goes on without it
            log.exception("copying pinned RAM tier entry %s failed; loading it unpinned", digest)
            pinned.drop(digest)
            return None
    tier.record_hit(digest)
    copy_s = time.perf_counter() - start
    nbytes = hold.nbytes
    totals = StageTotals(
        fetch_s=0.0,
        fetch_bytes=nbytes,
        decode_s=0.0,
        decode_bytes=0,
        place_s=copy_s,
        place_bytes=nbytes,
    )
    tier.record_read(nbytes, copy_s)
    return HeldLoad(buffers, totals, nbytes, copy_s)


def _copy(hold: Hold, dev: torch.device, sum_stream: torch.cuda.Stream) -> list[torch.Tensor]:
    """Every piece copied to new device buffers on the current stream and, where the
    hold has sums, summed on ``sum_stream`` as soon as it is copied (the sums of one
    piece overlap the copies of the next) and compared with the hold's; returns once
    the copies and the check are done. Raises ``BadEntry`` naming the first piece that
    differs."""
    out = [torch.empty(f.data_bytes, dtype=torch.uint8, device=dev) for f in hold.files]
    copy_stream = torch.cuda.current_stream(dev)
    rows: list[torch.Tensor] = []
    bad: list[int] = []
    try:
        for i, f in enumerate(hold.files):
            for begin, end in f.pieces():
                out[i][begin:end].copy_(hold.buffers[i][begin:end], non_blocking=True)
                if hold.sums is not None:
                    copied = torch.cuda.Event()
                    copied.record(copy_stream)
                    sum_stream.wait_event(copied)
                    with torch.cuda.stream(sum_stream):
                        rows.append(piece_sums(out[i], [(begin, end)]))
        if hold.sums is not None:
            copy_stream.wait_stream(sum_stream)
            got = torch.cat(rows) if rows else hold.sums
            bad = (got != hold.sums).any(dim=1).nonzero().flatten().tolist()  # waits for all
    finally:  # no copy may still read the hold when it is released
        sum_stream.synchronize()
        copy_stream.synchronize()
    if bad:
        i, begin, end = [(i, b, e) for i, f in enumerate(hold.files) for b, e in f.pieces()][bad[0]]
        raise BadEntry(
            f"{hold.files[i].path} does not match its checksum on the device (bytes {begin}-{end})"
        )
    return out
