"""Loads an artifact whose store holds a decompression bomb; reports memory as JSON.

Run as ``python -m tests.faults.security_bomb_child STORE_DIR CACHE_DIR REF``.
It prints one JSON line: the error type and message the load raised, the
peak RSS (KiB) before and after the load, and tracemalloc's peak (bytes)
during it. A separate process, so the peak RSS is this load's alone.
"""

from __future__ import annotations

import json
import resource
import sys
import tracemalloc
from pathlib import Path

import torch  # noqa: F401  (imported before the baseline is taken)

from snapshotter.cache import DiskCache
from snapshotter.config import CacheConfig, LoaderConfig
from snapshotter.loader import Snapshotter
from snapshotter.registry import Registry
from snapshotter.stores.local import LocalStore


def _peak_rss_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def main(store_dir: str, cache_dir: str, ref: str) -> None:
    snap = Snapshotter(
        Registry(LocalStore(Path(store_dir))),
        DiskCache(CacheConfig(directory=Path(cache_dir))),
        LoaderConfig(max_inflight_bytes=4 << 20, fetch_threads=2, decode_threads=2),
    )
    before_kib = _peak_rss_kib()
    tracemalloc.start()
    error = {"type": "", "message": ""}
    try:
        snap.load(ref)
    except Exception as exc:  # reported, judged by the test
        error = {"type": type(exc).__name__, "message": str(exc)}
    _, traced_peak_bytes = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    report = {
        **error,
        "rss_before_kib": before_kib,
        "rss_after_kib": _peak_rss_kib(),
        "traced_peak_bytes": traced_peak_bytes,
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main(*sys.argv[1:4])
