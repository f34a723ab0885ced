"""The worker's own health, sent in every heartbeat: can its cache disk take a load?

A worker whose cache filesystem is out of space still loads (chunks it cannot
cache are read from the store; ``snapshotter.cache`` leaves no partial entry),
but every start on it is slower and its disk may be failing, so it reports
itself unhealthy with the reason and the scheduler places no new replica on
it. Running replicas keep serving. The check runs every heartbeat, so the
worker is healthy again as soon as space is freed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_CACHE_MIN_FREE_BYTES = 64 << 20


@dataclass(frozen=True)
class Health:
    healthy: bool
    reason: str | None = None


HEALTHY = Health(True)


def cache_disk_health(directory: str, free_bytes: int, min_free_bytes: int) -> Health:
    """Unhealthy when the cache filesystem has less than ``min_free_bytes`` free (pure)."""
    if free_bytes >= min_free_bytes:
        return HEALTHY
    return Health(
        False,
        f"the cache disk at {directory} has {free_bytes} bytes free, under the "
        f"{min_free_bytes} needed; free space there, or point THAW_CACHE_DIR at a larger "
        "disk (or lower THAW_CACHE_MIN_FREE_BYTES)",
    )


def free_bytes(directory: Path) -> int:
    """Bytes an unprivileged writer may still use on the filesystem holding ``directory``
    (its nearest existing ancestor, before the cache is first created)."""
    path = directory.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def check_cache_disk(directory: Path, min_free_bytes: int) -> Health:
    try:
        free = free_bytes(directory)
    except OSError as exc:
        return Health(False, f"cannot check the cache disk at {directory}: {exc}")
    return cache_disk_health(str(directory), free, min_free_bytes)
