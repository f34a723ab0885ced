"""Settings -> the worker's configuration: RAM tier, pool, preloads, adapter cap."""

from __future__ import annotations

from pathlib import Path

from control_plane.settings import Settings
from worker.artifacts import ram_tier_config
from worker.bootstrap import agent_config, preload_modules, store_spec


def test_the_replicas_store_spec_carries_the_ram_tier(tmp_path: Path) -> None:
    settings = Settings(
        home=tmp_path,
        ram_tier_dir=tmp_path / "ram",
        ram_tier_max_bytes=123,
        ram_tier_verify=False,
        ram_tier_pin_ahead=False,
    )
    spec = store_spec(settings)
    assert spec.ram_tier_dir == str((tmp_path / "ram").resolve())
    assert (spec.ram_tier_max_bytes, spec.ram_tier_verify) == (123, False)
    assert spec.ram_tier_pin_ahead is False
    assert store_spec(Settings(home=tmp_path)).ram_tier_pin_ahead is True
    tier = ram_tier_config(spec)  # what the replica's loader is built with
    assert tier is not None and (tier.verify, tier.pin_ahead) == (False, False)
    assert store_spec(Settings(home=tmp_path, ram_tier_max_bytes=0)).ram_tier_max_bytes == 0


def test_a_worker_keeps_a_pool_of_preloaded_processes_by_default(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path, api_key="k")
    config = agent_config(settings)
    assert config.pool_size == 1 and config.adapter_cache_size == 8
    assert preload_modules(settings) == ("transformers", "peft")
    assert preload_modules(Settings(worker_pool_preload=" numpy, ,scipy")) == ("numpy", "scipy")
