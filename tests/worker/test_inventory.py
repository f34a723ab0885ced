"""What the heartbeat reports: models whose every chunk is in the disk cache; the phase split."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from snapshotter import DiskCache, Snapshotter
from snapshotter.config import CacheConfig
from snapshotter.push import push_directory
from snapshotter.registry import Registry
from snapshotter.stores import LocalStore
from worker.artifacts import weights_phases
from worker.inventory import CacheInventory


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
