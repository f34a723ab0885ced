"""Token buckets shared through a mapped file by the processes of one server."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from control_plane.errors import RateLimitedError
from control_plane.services import ratelimit_zone
from control_plane.services.ratelimit import Limit, RateLimiter
from control_plane.services.ratelimit_zone import SharedBuckets

SLOW = Limit(0.001, 40)  # 40 calls, then one every 1000 s: none refill during a test


def _allowed(path: Path, tries: int) -> int:
    """How many of ``tries`` calls a limiter on ``path`` let through (in a process)."""
    limiter = RateLimiter(lambda: 1000.0, buckets=SharedBuckets(path))
    allowed = 0
    for _ in range(tries):
        try:
            limiter.check("k", SLOW, "f")
        except RateLimitedError:
            continue
        allowed += 1
    return allowed


def test_processes_charging_at_once_let_through_the_burst_exactly(tmp_path: Path) -> None:
    zone = tmp_path / ratelimit_zone.ZONE_FILE
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        allowed = pool.starmap(_allowed, [(zone, 30)] * 4)
    assert sum(allowed) == SLOW.burst  # with buckets of their own: 4 x 30


def test_a_bucket_is_the_same_for_every_mapping(tmp_path: Path) -> None:
    zone = tmp_path / ratelimit_zone.ZONE_FILE
    clock = [1000.0]
    a = RateLimiter(lambda: clock[0], buckets=SharedBuckets(zone))
    b = RateLimiter(lambda: clock[0], buckets=SharedBuckets(zone))
    limit = Limit(1.0, 2)
    a.check("k", limit, "f")
    b.check("k", limit, "f")
    with pytest.raises(RateLimitedError, match="API key k"):
        a.check("k", limit, "f")
    clock[0] += 1.0  # one token back, for either
    b.check("k", limit, "f")
    with pytest.raises(RateLimitedError):
        a.check("k", limit, "f")
    a.check("other", limit, "f")  # another key has its own bucket


def test_a_full_neighbourhood_gives_up_the_bucket_charged_longest_ago(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ratelimit_zone, "SLOTS", ratelimit_zone.PROBE)  # every name, one run
    clock = [1000.0]
    limiter = RateLimiter(lambda: clock[0], buckets=SharedBuckets(tmp_path / "zone"))
    one = Limit(0.001, 1)
    for i in range(ratelimit_zone.PROBE):  # fills every slot, each bucket now empty
        limiter.check(f"k{i}", one, "f")
        clock[0] += 1.0
    limiter.check("new", one, "f")  # takes k0's slot: charged longest ago
    with pytest.raises(RateLimitedError):
        limiter.check("k1", one, "f")  # still held
    limiter.check("k0", one, "f")  # forgotten: starts full again
