"""bench/ram_tier.py, one trial on a small model: a second replica served by the RAM tier
or by the disk cache's mapped entries shares the first one's pages; one served by the
disk cache with mapping off holds its own copy."""

from __future__ import annotations

import json
from pathlib import Path

from bench.ram_tier import ROWS, main


def test_one_trial_shows_the_tier_and_the_mapped_cache_shared_and_the_copy_not(
    tmp_path: Path,
) -> None:
    out = tmp_path / "ram.json"
    argv = ["--size-mb", "64", "--trials", "1", "--data-dir", str(tmp_path), "--json", str(out)]
    assert main(argv) == 0
    rows = json.loads(out.read_text())["rows"]
    assert set(rows) == set(ROWS)
    for row in ("tier-verify", "tier-noverify"):
        assert rows[row]["from_tier"]
        assert rows[row]["second_added_pct"] < 25  # page tables and small objects, no copy
    for row in ("cache", "cache-copy"):
        assert not rows[row]["from_tier"]
    assert rows["cache"]["second_added_pct"] < 25  # the page cache's pages, mapped by both
    assert rows["cache-copy"]["second_added_pct"] > 75  # its own copy of the weights
    assert not list(Path("/dev/shm").glob("thaw-bench-ram-*"))  # the tier was removed
