"""Where a pinned RAM-tier load to CUDA loses to the pinned ceiling: one process, one
GiB, each way of copying timed apart (medians of ``--trials``).

    python bench/h2d_sources.py [--mb 1024] [--trials 5]

Rows: the ceiling (torch's pinned allocation, one copy); the same bytes in a tmpfs
file mapped read-only and registered (``cudaHostRegister``), copied whole, then in
32 MiB pieces on one stream, then from a thread and a stream per piece, then with
each piece checked (xxh3) first, as ``snapshotter.loader_pinned`` does; the checks
alone; the device allocation alone. Needs a CUDA device.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from snapshotter.digest import checksum_bytes
from snapshotter.loader_cuda import register_read_only, unregister
from snapshotter.ram_tier_entry import bytes_view, map_file

PIECE = 32 << 20


def _time(run: Callable[[], object], trials: int) -> float:
    runs = []
    for _ in range(trials):
        torch.cuda.synchronize()
        start = time.perf_counter()
        run()
        torch.cuda.synchronize()
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=1024)
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args()
    n = args.mb << 20
    torch.zeros(1, device="cuda")
    for name in ("/sys/kernel/mm/transparent_hugepage/shmem_enabled",):
        print(name, Path(name).read_text().strip() if Path(name).exists() else "-")
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    path = Path(tempfile.mkstemp(prefix="thaw-h2d-", dir=shm)[1])
    data = torch.randint(0, 255, (n,), dtype=torch.uint8)
    path.write_bytes(data.numpy().tobytes())
    pieces = [(b, min(b + PIECE, n)) for b in range(0, n, PIECE)]
    pinned = data.pin_memory()
    mapped = map_file(path, n, read_only=True)
    ok = [register_read_only(mapped[b:e]) for b, e in pieces]
    assert all(ok), "registration refused"
    view = bytes_view(mapped)
    sums = {b: checksum_bytes(view[b:e]) for b, e in pieces}
    threads = ThreadPoolExecutor(min(len(pieces), os.cpu_count() or 1))
    local = threading.local()

    def stream() -> torch.cuda.Stream:
        s = getattr(local, "s", None)
        if s is None:
            s = local.s = torch.cuda.Stream()
        return s

    def dst() -> torch.Tensor:
        return torch.empty(n, dtype=torch.uint8, device="cuda")

    def ceiling() -> None:
        dst().copy_(pinned, non_blocking=True)

    def pieces_one_stream() -> None:
        out = dst()
        for b, e in pieces:
            out[b:e].copy_(mapped[b:e], non_blocking=True)

    def pieces_threads(check: bool) -> Callable[[], None]:
        def run() -> None:
            out = dst()
            torch.cuda.current_stream().synchronize()
            used: list[torch.cuda.Stream] = []

            def one(piece: tuple[int, int]) -> None:
                b, e = piece
                if check:
                    assert checksum_bytes(view[b:e]) == sums[b]
                s = stream()
                with torch.cuda.stream(s):
                    out[b:e].copy_(mapped[b:e], non_blocking=True)
                used.append(s)

            list(threads.map(one, pieces))
            for s in set(used):
                s.synchronize()

        return run

    def checks_then_one_stream() -> None:
        out = dst()
        list(threads.map(lambda p: checksum_bytes(view[p[0] : p[1]]), pieces))
        for b, e in pieces:
            out[b:e].copy_(mapped[b:e], non_blocking=True)

    def checks_in_order_one_stream() -> None:
        out = dst()
        futures = [threads.submit(checksum_bytes, view[b:e]) for b, e in pieces]
        for (b, e), f in zip(pieces, futures, strict=True):
            f.result()
            out[b:e].copy_(mapped[b:e], non_blocking=True)

    def checks_alone() -> None:
        list(threads.map(lambda p: checksum_bytes(view[p[0] : p[1]]), pieces))

    def alloc_alone() -> None:
        dst()

    def alloc_fresh() -> None:
        torch.cuda.empty_cache()
        dst()

    rows = [
        ("pinned ceiling (torch pin_memory, one copy)", ceiling),
        ("registered tmpfs, 32 MiB pieces, one stream", pieces_one_stream),
        ("registered tmpfs, a thread+stream a piece", pieces_threads(False)),
        ("  ... each piece checked first (loader_pinned)", pieces_threads(True)),
        ("registered tmpfs, all checked, then one stream", checks_then_one_stream),
        ("registered tmpfs, checked in order, one stream", checks_in_order_one_stream),
        ("checks alone (xxh3, threads)", checks_alone),
        ("device allocation alone (cached)", alloc_alone),
        ("device allocation, cache emptied", alloc_fresh),
    ]
    print(f"{'row':50} {'median ms':>10} {'GB/s':>8}")
    for label, run in rows:
        run()  # warm
        s = _time(run, args.trials)
        print(f"{label:50} {s * 1000:10.2f} {n / s / 1e9:8.2f}", flush=True)
    for b, _e in pieces:
        unregister(mapped[b:].data_ptr())
    path.unlink()


if __name__ == "__main__":
    main()
