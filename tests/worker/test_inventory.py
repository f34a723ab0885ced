"""What the heartbeat reports: tier holdings, models whose tensor data is all in the disk
cache, measured bandwidths; the phase split."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from snapshotter import DiskCache, Snapshotter
from snapshotter.config import CacheConfig, RamTierConfig
from snapshotter.push import push_directory
from snapshotter.ram_tier import RamTier
from snapshotter.registry import Registry
from snapshotter.stores import LocalStore
from worker.artifacts import load_stats, weights_phases
from worker.child_protocol import LoadStats
from worker.inventory import BandwidthMeter, CacheInventory, bandwidths, load_bandwidth


def test_only_fully_cached_models_are_reported(
    tmp_path: Path, llama_dir: Path, adapter_dirs: list[Path]
) -> None:
    registry = Registry(LocalStore(tmp_path / "store"))
    model = push_directory(llama_dir, "llama:v1", registry).digest
    adapter = push_directory(adapter_dirs[0], "ad:v1", registry).digest
    config = CacheConfig(directory=tmp_path / "cache", max_bytes=1 << 30)
    inventory = CacheInventory(config, registry, refresh_every=1)
    assert inventory.snapshot({model, adapter}) == ([], 0)
    Snapshotter(registry, DiskCache(config)).load(model, "cpu")  # fills the cache
    cached, cache_bytes = inventory.snapshot({model, adapter, "blake3:" + "0" * 64})
    assert cached == [model]
    assert cache_bytes > 0


def test_holdings_per_tier_and_bandwidths_from_loads(
    tmp_path: Path, llama_dir: Path, adapter_dirs: list[Path]
) -> None:
    registry = Registry(LocalStore(tmp_path / "store"))
    model = push_directory(llama_dir, "llama:v1", registry).digest
    adapter = push_directory(adapter_dirs[0], "ad:v1", registry).digest
    config = CacheConfig(directory=tmp_path / "cache", max_bytes=1 << 30)
    tier = RamTier(RamTierConfig(directory=tmp_path / "ram", max_bytes=1 << 30))
    inventory = CacheInventory(config, registry, refresh_every=1, ram_tier=tier)
    empty = inventory.report({model, adapter})
    assert (empty.holdings, empty.cached_manifests, empty.ram_read_bytes_per_s) == ([], [], None)

    snap = Snapshotter(registry, DiskCache(config), ram_tier=tier)
    cold = snap.load(model, "cpu")  # store -> disk cache and RAM tier
    warm = snap.load(model, "cpu")  # RAM tier
    tensor_bytes = cold.report.tensor_bytes
    report = inventory.report({model, adapter})
    held = {(h.tier, h.digest): h.bytes for h in report.holdings}
    assert held == {("ram", model): tensor_bytes, ("disk", model): tensor_bytes}
    assert report.cached_manifests == [model]
    assert report.ram_read_bytes_per_s is not None and report.ram_read_bytes_per_s > 0

    meter = BandwidthMeter()
    meter.observe([load_stats(cold.report), load_stats(warm.report)])
    rates = bandwidths(report, meter)
    assert rates.ram_bytes_per_s == report.ram_read_bytes_per_s
    assert rates.store_bytes_per_s is not None and rates.store_bytes_per_s > 0
    assert rates.disk_bytes_per_s is None  # no load came from the disk cache


def _stats(cache: int, store: int, ram: int = 0, seconds: float = 2.0) -> LoadStats:
    return LoadStats(
        digest="d",
        tensor_bytes=cache + store + ram,
        ram_bytes=ram,
        cache_bytes=cache,
        store_bytes=store,
        seconds=seconds,
    )


@pytest.mark.parametrize(
    ("stats", "expected"),
    [
        (_stats(cache=100, store=0), ("disk", 50.0)),
        (_stats(cache=5, store=95), ("store", 50.0)),
        (_stats(cache=50, store=50), None),  # mixed: says nothing clean
        (_stats(cache=0, store=0, ram=100), None),  # the tier measures itself
        (_stats(cache=100, store=0, seconds=0.0), None),
    ],
)
def test_a_load_measures_the_tier_that_served_it(
    stats: LoadStats, expected: tuple[str, float] | None
) -> None:
    assert load_bandwidth(stats) == expected


def test_bandwidth_is_a_moving_average() -> None:
    meter = BandwidthMeter()
    meter.observe([_stats(cache=100, store=0, seconds=1.0)])
    assert meter.get("disk") == 100.0
    meter.observe([_stats(cache=200, store=0, seconds=1.0)])
    assert meter.get("disk") == pytest.approx(130.0)
    assert meter.get("store") is None


@dataclass
class Stage:
    seconds: float


@dataclass
class Report:
    fetch: Stage
    verify_decompress: Stage
    place: Stage
    setup_s: float
    wall_s: float


@pytest.mark.parametrize(
    ("fetch_s", "decode_s", "place_s", "expected_to_device_ms"),
    [(1.0, 1.0, 2.0, 500.0), (1.0, 0.0, 0.0, 0.0), (0.0, 0.0, 0.0, 0.0)],
)
def test_wall_time_is_split_by_stage_busy_time(
    fetch_s: float, decode_s: float, place_s: float, expected_to_device_ms: float
) -> None:
    report = Report(Stage(fetch_s), Stage(decode_s), Stage(place_s), setup_s=0.2, wall_s=1.2)
    phases = weights_phases(report)
    assert phases["weights_to_device"] == pytest.approx(expected_to_device_ms)
    assert phases["weights_fetch"] + phases["weights_to_device"] == pytest.approx(1200.0)
