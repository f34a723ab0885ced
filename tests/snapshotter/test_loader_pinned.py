"""The RAM tier pinned ahead: a process prewarmed for CUDA registers the tier's entries
while it waits, and its load checks and copies them with no registration."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from snapshotter import DiskCache, Snapshotter
from snapshotter.config import CacheConfig, RamTierConfig, StoreConfig
from snapshotter.ram_tier import RamTier
from tests.snapshotter.loadkit import assert_same_tensors, counting_registry, expected_tensors, push

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _held(tmp_path: Path, llama_dir: Path, tier_config: RamTierConfig) -> tuple[Any, str]:
    """The llama pushed and loaded once on the CPU (its weights now in the tier); the
    counting store and the digest."""
    registry, store = counting_registry(StoreConfig(url=str(tmp_path / "store")))
    digest = push(registry, llama_dir, "llama:v1")
    Snapshotter(registry, _cache(tmp_path / "c1"), ram_tier=RamTier(tier_config)).load(digest)
    return (registry, store), digest


def _cache(path: Path) -> DiskCache:
    return DiskCache(CacheConfig(directory=path))


def _until(what: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if what():
            return True
        time.sleep(0.05)
    return what()


def test_a_prewarmed_cuda_process_copies_the_tier_from_pages_pinned_ahead(
    tmp_path: Path, llama_dir: Path, tier_config: RamTierConfig
) -> None:
    (registry, store), digest = _held(tmp_path, llama_dir, tier_config)
    tier = RamTier(tier_config)
    snap = Snapshotter(registry, _cache(tmp_path / "c2"), ram_tier=tier)
    snap.prewarm("cuda")
    held = snap.pinned_bytes(wait_s=30)
    assert held == {digest: tier.contains_bytes(snap.resolve(digest)[1])} and held[digest] > 0

    store.reset()
    loaded = snap.load(digest, "cuda")
    report = loaded.report
    assert store.gets == []
    assert report.ram_tier_pinned_bytes == report.ram_tier_bytes == report.tensor_bytes
    assert all(t.device.type == "cuda" for t in loaded.values())
    assert_same_tensors(loaded, expected_tensors(llama_dir))
    assert tier.counters().hits == 1 and tier.counters().corrupt == 0  # the device sums agree

    snap.give_back_host_memory()  # specialized: the holds go
    assert snap.pinned_bytes() == {}
    again = snap.load(digest, "cuda")  # unpinned, from the tier all the same
    assert again.report.ram_tier_bytes == again.report.tensor_bytes
    assert again.report.ram_tier_pinned_bytes == 0
    assert_same_tensors(again, expected_tensors(llama_dir))


def test_without_pin_ahead_nothing_is_held(
    tmp_path: Path, llama_dir: Path, tier_config: RamTierConfig
) -> None:
    (registry, _store), digest = _held(tmp_path, llama_dir, tier_config)
    config = RamTierConfig(tier_config.directory, tier_config.max_bytes, pin_ahead=False)
    snap = Snapshotter(registry, _cache(tmp_path / "c2"), ram_tier=RamTier(config))
    snap.prewarm("cuda")
    assert snap.pinned_bytes(wait_s=30) == {}
    loaded = snap.load(digest, "cuda")
    assert loaded.report.ram_tier_bytes == loaded.report.tensor_bytes
    assert loaded.report.ram_tier_pinned_bytes == 0


def _flip_byte(path: Path) -> None:
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:
        f.seek(path.stat().st_size // 2)
        middle = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([middle[0] ^ 0xFF]))


def _truncate(path: Path) -> None:
    os.chmod(path, 0o644)
    os.truncate(path, path.stat().st_size - 1)


@pytest.mark.parametrize("damage", [_flip_byte, _truncate])
def test_a_byte_damaged_after_the_pin_is_caught_and_the_load_falls_back(
    tmp_path: Path,
    llama_dir: Path,
    tier_config: RamTierConfig,
    damage: Callable[[Path], None],
) -> None:
    (registry, store), digest = _held(tmp_path, llama_dir, tier_config)
    tier = RamTier(tier_config)
    snap = Snapshotter(registry, _cache(tmp_path / "c1"), ram_tier=tier)  # c1: cached
    snap.prewarm("cuda")
    assert digest in snap.pinned_bytes(wait_s=30)
    damage(max(tier.entry_dir(digest).glob("*.data"), key=lambda f: f.stat().st_size))

    store.reset()
    fallback = snap.load(digest, "cuda")
    assert tier.counters().corrupt == 1
    assert fallback.report.ram_tier_bytes == 0
    assert fallback.report.cache_hits == fallback.report.chunks > 0  # the disk cache served it
    assert store.chunk_gets() == []
    assert_same_tensors(fallback, expected_tensors(llama_dir))

    # The fallback put a good copy back, which the next load maps (a loading process
    # pins nothing more: it is becoming a replica).
    assert digest not in snap.pinned_bytes()
    healed = snap.load(digest, "cuda")
    assert healed.report.ram_tier_bytes == healed.report.tensor_bytes
    assert healed.report.ram_tier_pinned_bytes == 0
    assert_same_tensors(healed, expected_tensors(llama_dir))
    snap.give_back_host_memory()


def test_the_refresh_pins_new_entries_and_releases_dropped_ones(
    tmp_path: Path, llama_dir: Path, tier_config: RamTierConfig
) -> None:
    registry, _store = counting_registry(StoreConfig(url=str(tmp_path / "store")))
    digest = push(registry, llama_dir, "llama:v1")
    tier = RamTier(tier_config)
    snap = Snapshotter(registry, _cache(tmp_path / "c"), ram_tier=tier)
    snap.prewarm("cuda")
    assert snap.pinned_bytes(wait_s=30) == {}  # the tier was empty

    Snapshotter(registry, _cache(tmp_path / "c"), ram_tier=RamTier(tier_config)).load(digest)
    assert _until(lambda: digest in snap.pinned_bytes())

    tier.drop(digest)
    assert _until(lambda: snap.pinned_bytes() == {})
    missed = snap.load(digest, "cuda")  # from the disk cache, kept in the tier again
    assert missed.report.ram_tier_bytes == 0
    assert_same_tensors(missed, expected_tensors(llama_dir))
    assert digest in tier
    time.sleep(2.5)  # two refreshes' worth: a loading process pins nothing more
    assert snap.pinned_bytes() == {}
    snap.give_back_host_memory()


def test_an_entry_damaged_before_the_pin_is_dropped_by_the_pinning_thread(
    tmp_path: Path, llama_dir: Path, tier_config: RamTierConfig
) -> None:
    (registry, _store), digest = _held(tmp_path, llama_dir, tier_config)
    tier = RamTier(tier_config)
    _flip_byte(max(tier.entry_dir(digest).glob("*.data"), key=lambda f: f.stat().st_size))
    snap = Snapshotter(registry, _cache(tmp_path / "c1"), ram_tier=tier)
    snap.prewarm("cuda")
    assert snap.pinned_bytes(wait_s=30) == {}
    assert tier.counters().corrupt == 1 and digest not in tier
    loaded = snap.load(digest, "cuda")
    assert loaded.report.cache_hits == loaded.report.chunks > 0
    assert_same_tensors(loaded, expected_tensors(llama_dir))
    snap.give_back_host_memory()
