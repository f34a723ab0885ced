"""Re-checking a worker's tiers with the content digests (``thaw cache verify``), on a real
disk cache and a RAM tier in /dev/shm filled by real loads."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from snapshotter import cache_entry, codec
from snapshotter.cache import DiskCache
from snapshotter.config import CacheConfig, RamTierConfig
from snapshotter.digest import checksum_bytes, digest_bytes
from snapshotter.loader import Snapshotter
from snapshotter.ram_tier import RamTier
from snapshotter.registry import Registry
from snapshotter.stores.local import LocalStore
from snapshotter.tier_verify import verify_cache, verify_tier
from tests.snapshotter.loadkit import (
    assert_same_tensors,
    entry_payload_at,
    expected_tensors,
    push,
)


@pytest.fixture
def tier_config() -> Iterator[RamTierConfig]:
    shm = Path("/dev/shm")
    directory = Path(
        tempfile.mkdtemp(prefix="thaw-test-verify-", dir=shm if shm.is_dir() else None)
    )
    yield RamTierConfig(directory=directory, max_bytes=256 << 20)
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def loaded(tmp_path: Path, llama_dir: Path, tier_config: RamTierConfig) -> tuple[Registry, str]:
    """The tiny Llama loaded once: in the disk cache and in the RAM tier."""
    registry = Registry(LocalStore(tmp_path / "store"))
    digest = push(registry, llama_dir, "llama:v1")
    cache = DiskCache(CacheConfig(directory=tmp_path / "cache"))
    Snapshotter(registry, cache, ram_tier=RamTier(tier_config)).load(digest)
    return registry, digest


def _cache(tmp_path: Path) -> DiskCache:
    return DiskCache(CacheConfig(directory=tmp_path / "cache"))


def _flip(path: Path, at: int) -> None:
    os.chmod(path, 0o644)
    data = bytearray(path.read_bytes())
    data[at] ^= 0x08
    path.write_bytes(bytes(data))


def test_sound_tiers_pass_and_progress_covers_every_byte(
    tmp_path: Path, loaded: tuple[Registry, str], tier_config: RamTierConfig
) -> None:
    cache = _cache(tmp_path)
    seen: list[int] = []
    check = verify_cache(cache, seen.append)
    assert check.ok and check.entries == len(cache.entries()) > 0
    assert sum(seen) == check.bytes_checked == cache.total_bytes

    tier = RamTier(tier_config)
    seen.clear()
    check = verify_tier(tier, seen.append)
    assert check.ok and check.entries == 1 and check.recorded == 0
    assert sum(seen) == check.bytes_checked == tier.inventory().total_bytes


def test_damaged_cache_entries_are_named_and_dropped_older_ones_left_for_a_load(
    tmp_path: Path, loaded: tuple[Registry, str], llama_dir: Path
) -> None:
    cache = _cache(tmp_path)
    big = sorted((d for d, e in cache.entries().items() if e.size_bytes > 64), reverse=True)
    flipped, cut, bad_checksum, older, older_bad = big[:5]
    _flip(cache.path(flipped), entry_payload_at(cache.path(flipped)) + 10)
    os.truncate(cache.path(cut), cache.path(cut).stat().st_size - 1)
    _flip(cache.path(bad_checksum), codec.HEADER_SIZE)  # bytes sound, checksum wrong
    for d in (older, older_bad):  # as an older thaw wrote them: no checksum
        raw = cache.path(d).read_bytes()[entry_payload_at(cache.path(d)) :]
        cache.path(d).write_bytes(codec.HEADER.pack(codec.MAGIC, codec.Codec.RAW, len(raw)) + raw)
    _flip(cache.path(older_bad), codec.HEADER_SIZE + 3)

    cache = _cache(tmp_path)
    check = verify_cache(cache)
    assert {d.digest for d in check.damaged} == {flipped, cut, bad_checksum, older_bad}
    assert check.recorded == 0 and check.older == 1
    for d in (flipped, cut, bad_checksum, older_bad):
        assert d not in cache and not cache.path(d).exists()
    # The sound older entry is left as it was, for a load to record ...
    assert cache.path(older).read_bytes()[:4] == codec.MAGIC
    assert verify_cache(_cache(tmp_path)).ok  # what is left is sound

    # ... which writes it as a load writes an entry, with its checksum.
    registry, digest = loaded
    tensors = Snapshotter(registry, _cache(tmp_path)).load(digest)
    assert_same_tensors(tensors, expected_tensors(llama_dir))
    raw = cache.path(older).read_bytes()[entry_payload_at(cache.path(older)) :]
    assert cache.path(older).read_bytes()[:4] == cache_entry.MAGIC
    assert digest_bytes(raw) == older
    assert verify_cache(_cache(tmp_path)).older == 0


def test_bytes_wrong_when_the_tier_recorded_them_are_caught_by_the_digests(
    tmp_path: Path, loaded: tuple[Registry, str], tier_config: RamTierConfig, llama_dir: Path
) -> None:
    registry, digest = loaded
    tier = RamTier(tier_config)
    entry = tier.entry_dir(digest)
    data = max(entry.glob("*.data"), key=lambda f: f.stat().st_size)
    _flip(data, data.stat().st_size // 2)
    # Record the checksum of the damaged bytes: a load's check would pass them.
    meta = json.loads((entry / "meta.json").read_bytes())
    index = int(data.name.split(".")[0])
    meta["files"][index]["xxh3"] = [f"{checksum_bytes(data.read_bytes()):016x}"]
    (entry / "meta.json").write_text(json.dumps(meta))

    check = verify_tier(tier)
    [damaged] = check.damaged
    assert damaged.digest == digest and "does not match chunk blake3:" in damaged.reason
    assert digest not in tier
    snap = Snapshotter(registry, _cache(tmp_path), ram_tier=tier)
    assert_same_tensors(snap.load(digest), expected_tensors(llama_dir))


def test_an_older_tier_entry_is_recorded(
    loaded: tuple[Registry, str], tier_config: RamTierConfig
) -> None:
    _registry, digest = loaded
    entry = RamTier(tier_config).entry_dir(digest)
    meta = json.loads((entry / "meta.json").read_bytes())
    for i, f in enumerate(meta["files"]):
        f["digest"] = digest_bytes((entry / f"{i}.data").read_bytes())
        del f["xxh3"]
    meta["format"] = 1
    (entry / "meta.json").write_text(json.dumps(meta))

    check = verify_tier(RamTier(tier_config))
    assert check.ok and check.recorded == 1
    assert json.loads((entry / "meta.json").read_bytes())["format"] == 3


def test_thaw_cache_verify_names_damage_and_exits_1_then_0(
    tmp_path: Path, loaded: tuple[Registry, str], tier_config: RamTierConfig
) -> None:
    _registry, digest = loaded
    env = {
        "THAW_HOME": str(tmp_path / "home"),
        "THAW_CACHE_DIR": str(tmp_path / "cache"),
        "THAW_RAM_TIER_DIR": str(tier_config.directory),
        "COLUMNS": "200",
    }
    cache = _cache(tmp_path)
    victim = max(cache.entries(), key=lambda d: cache.entries()[d].size_bytes)
    _flip(cache.path(victim), entry_payload_at(cache.path(victim)) + 1)
    tier_data = max(
        RamTier(tier_config).entry_dir(digest).glob("*.data"), key=lambda f: f.stat().st_size
    )
    _flip(tier_data, 7)

    result = CliRunner().invoke(app, ["cache", "verify"], env=env)
    assert result.exit_code == 1, result.output
    assert f"damaged disk cache entry {victim}" in result.output
    assert f"damaged RAM tier entry {digest}" in result.output
    assert "disk cache: " in result.output and "1 damaged" in result.output

    result = CliRunner().invoke(app, ["cache", "verify"], env=env)
    assert result.exit_code == 0, result.output
    assert "disk cache: " in result.output and "RAM tier: 0 entries" in result.output
    assert "damaged" not in result.output
