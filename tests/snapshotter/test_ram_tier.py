"""The host-RAM tier: a second start maps its weights from shared memory, no disk, no store."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import snapshotter.loader as loader_module
from control_plane.settings import Settings
from snapshotter import DiskCache, Snapshotter
from snapshotter.config import CacheConfig, RamTierConfig, StoreConfig
from snapshotter.digest import checksum_bytes, digest_bytes, hex_part
from snapshotter.load_plan import FilePlan
from snapshotter.ram_tier import RamTier
from snapshotter.ram_tier_entry import BadEntry, TierFile, bytes_view, check_files
from snapshotter.registry import Registry
from snapshotter.stores.local import LocalStore
from tests.snapshotter.loadkit import (
    assert_same_tensors,
    counting_registry,
    expected_tensors,
    push,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
_SHM = Path("/dev/shm")


def _cache(path: Path) -> DiskCache:
    return DiskCache(CacheConfig(directory=path))


def _tier_maps(tier: RamTier) -> list[str]:
    """Lines of this process's memory map that are files of the tier."""
    with open("/proc/self/maps") as f:
        return [line for line in f if str(tier.root) in line]


def test_second_start_is_served_by_the_ram_tier_with_no_disk_or_store_read(
    store_config: StoreConfig, tmp_path: Path, llama_dir: Path, tier_config: RamTierConfig
) -> None:
    registry, store = counting_registry(store_config)
    digest = push(registry, llama_dir, "llama:v1")
    first = Snapshotter(registry, _cache(tmp_path / "c1"), ram_tier=RamTier(tier_config)).load(
        "llama:v1"
    )
    assert first.report.ram_tier_bytes == 0 and first.report.store_bytes > 0
    assert first.report.ram_tier_insert_s > 0
    # The first replica already uses the tier's pages instead of its own copy.
    tier = RamTier(tier_config)
    assert any(hex_part(digest) in line for line in _tier_maps(tier))

    # A new replica: the disk cache it would read is gone, and a fresh one is empty.
    shutil.rmtree(tmp_path / "c1")
    store.reset()
    snap = Snapshotter(registry, _cache(tmp_path / "c2"), ram_tier=tier)
    second = snap.load(digest)

    assert store.gets == []  # no chunk, no manifest, no profile
    report = second.report
    assert report.chunks == 0 and report.cache_hits == 0 and report.store_gets == 0
    assert report.ram_tier_bytes == report.tensor_bytes > 0
    assert report.tier_bytes == {"ram": report.tensor_bytes, "cache": 0, "store": 0}
    counters = snap.source.counters()
    assert counters.cache_hits == counters.cache_misses == counters.store_gets == 0
    assert tier.counters().hits == 1
    assert_same_tensors(second, expected_tensors(llama_dir))


def test_writes_by_the_function_do_not_reach_the_tier(
    tmp_path: Path, llama_dir: Path, tier_config: RamTierConfig
) -> None:
    registry = Registry(LocalStore(tmp_path / "store"))
    digest = push(registry, llama_dir, "llama:v1")
    tier = RamTier(tier_config)
    snap = Snapshotter(registry, _cache(tmp_path / "cache"), ram_tier=tier)
    for tensors in (snap.load(digest), snap.load(digest)):  # fresh load, then a tier hit
        for t in tensors.values():
            t.add_(1)  # copy-on-write pages, private to this replica

    third = snap.load(digest)
    assert third.report.ram_tier_bytes == third.report.tensor_bytes
    assert tier.counters().corrupt == 0
    assert_same_tensors(third, expected_tensors(llama_dir))


_CHILD = """
import json, sys, torch
from pathlib import Path
from snapshotter import DiskCache, Snapshotter
from snapshotter.config import CacheConfig, RamTierConfig
from snapshotter.ram_tier import RamTier
from snapshotter.registry import Registry
from snapshotter.stores.local import LocalStore
from tests.snapshotter.loadkit import CountingStore

args = json.loads(sys.argv[1])
store = CountingStore(LocalStore(Path(args["store"])))
tier = RamTier(RamTierConfig(directory=Path(args["tier"]), max_bytes=args["max_bytes"]))
snap = Snapshotter(Registry(store), DiskCache(CacheConfig(Path(args["cache"]))), ram_tier=tier)
tensors = snap.load(args["digest"])
torch.save(dict(tensors), args["out"])
print(json.dumps({"store_gets": len(store.gets), "ram_tier_bytes": tensors.report.ram_tier_bytes,
                  "tensor_bytes": tensors.report.tensor_bytes, "chunks": tensors.report.chunks}))
"""


def test_a_second_process_maps_the_same_shared_memory(
    tmp_path: Path, llama_dir: Path, tier_config: RamTierConfig
) -> None:
    registry = Registry(LocalStore(tmp_path / "store"))
    digest = push(registry, llama_dir, "llama:v1")
    Snapshotter(registry, _cache(tmp_path / "cache"), ram_tier=RamTier(tier_config)).load(digest)

    args = {
        "store": str(tmp_path / "store"),
        "tier": str(tier_config.directory),
        "max_bytes": tier_config.max_bytes,
        "cache": str(tmp_path / "child-cache"),  # empty: a chunk read would hit the store
        "digest": digest,
        "out": str(tmp_path / "child.pt"),
    }
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(args)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    child = json.loads(done.stdout.strip().splitlines()[-1])
    assert child["store_gets"] == 0 and child["chunks"] == 0
    assert child["ram_tier_bytes"] == child["tensor_bytes"] > 0
    assert_same_tensors(torch.load(tmp_path / "child.pt"), expected_tensors(llama_dir))


# --- eviction: the tier alone, small synthetic entries ----------------------------


def _put(tier: RamTier, name: str, nbytes: int) -> bool:
    digest = "blake3:" + name * 64
    files = [FilePlan("model.safetensors", nbytes, ())]
    return tier.put(digest, b"{}", files, [torch.full((nbytes,), 7, dtype=torch.uint8)])


def _digest(name: str) -> str:
    return "blake3:" + name * 64


def test_least_recently_used_entry_is_evicted_under_the_cap(tmp_path: Path) -> None:
    config = RamTierConfig(directory=tmp_path / "tier", max_bytes=250)
    tier, other_process = RamTier(config), RamTier(config)  # two views of one directory
    assert _put(tier, "a", 100) and _put(other_process, "b", 100)
    held_a = other_process.get(_digest("a"), [FilePlan("model.safetensors", 100, ())])
    assert held_a is not None  # a is now more recent than b, for every process

    assert _put(tier, "c", 100)
    assert set(other_process.inventory().manifests) == {_digest("a"), _digest("c")}
    assert tier.counters().evictions == 1

    assert _put(tier, "d", 100)  # a is evicted while its mapping is in use ...
    assert _digest("a") not in other_process
    assert torch.equal(held_a.buffers[0], torch.full((100,), 7, dtype=torch.uint8))  # ... intact

    assert not _put(tier, "e", 251)  # larger than the cap: not held, nothing evicted
    assert tier.counters().too_large == 1
    assert tier.inventory().total_bytes == 200


def test_inventory_contains_bytes_and_measured_bandwidth(
    tmp_path: Path, llama_dir: Path, adapter_dirs: list[Path], tier_config: RamTierConfig
) -> None:
    registry = Registry(LocalStore(tmp_path / "store"))
    llama = push(registry, llama_dir, "llama:v1")
    adapter = push(registry, adapter_dirs[0], "ad0:v1")
    tier = RamTier(tier_config)
    snap = Snapshotter(registry, _cache(tmp_path / "cache"), ram_tier=tier)
    assert tier.inventory().read_bytes_per_s is None
    sizes = {d: snap.load(d).report.tensor_bytes for d in (llama, adapter)}

    inventory = tier.inventory()
    assert dict(inventory.manifests) == sizes
    assert inventory.total_bytes == sum(sizes.values())
    assert inventory.max_bytes == tier_config.max_bytes
    assert tier.contains_bytes(registry.get_manifest(llama)) == sizes[llama]
    push(registry, adapter_dirs[1], "ad1:v1")
    assert tier.contains_bytes(registry.get_manifest(registry.resolve("ad1:v1"))) == 0

    snap.load(llama)
    rate = tier.inventory().read_bytes_per_s
    assert rate is not None and rate > 0


# --- integrity ------------------------------------------------------------------


def _held(
    tmp_path: Path, llama_dir: Path, tier_config: RamTierConfig
) -> tuple[Snapshotter, RamTier, str]:
    """The llama pushed to a local store and loaded once: its weights in the tier."""
    registry = Registry(LocalStore(tmp_path / "store"))
    digest = push(registry, llama_dir, "llama:v1")
    tier = RamTier(tier_config)
    snap = Snapshotter(registry, _cache(tmp_path / "cache"), ram_tier=tier)
    snap.load(digest)
    return snap, tier, digest


def _flip_byte(path: Path) -> None:
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:
        first = f.read(1)
        f.seek(0)
        f.write(bytes([first[0] ^ 0xFF]))


def _truncate(path: Path) -> None:
    os.chmod(path, 0o644)
    os.truncate(path, path.stat().st_size - 1)


def _bad_meta(path: Path) -> None:
    (path.parent / "meta.json").write_text("{not json")


_CUDA = pytest.param(
    "cuda",
    marks=[
        pytest.mark.gpu,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    ],
)


@pytest.mark.parametrize("device", ["cpu", _CUDA])
@pytest.mark.parametrize("damage", [_flip_byte, _truncate, _bad_meta])
def test_a_corrupt_entry_is_dropped_the_load_falls_back_and_heals(
    tmp_path: Path,
    llama_dir: Path,
    tier_config: RamTierConfig,
    damage: Callable[[Path], None],
    device: str,
) -> None:
    registry, store = counting_registry(StoreConfig(url=str(tmp_path / "store")))
    digest = push(registry, llama_dir, "llama:v1")
    tier = RamTier(tier_config)
    snap = Snapshotter(registry, _cache(tmp_path / "cache"), ram_tier=tier)
    snap.load(digest, device)
    damage(max(tier.entry_dir(digest).glob("*.data"), key=lambda f: f.stat().st_size))

    store.reset()
    fallback = snap.load(digest, device)
    assert tier.counters().corrupt == 1
    assert fallback.report.ram_tier_bytes == 0
    assert fallback.report.cache_hits == fallback.report.chunks > 0  # the disk cache served it
    assert store.chunk_gets() == []
    assert_same_tensors(fallback, expected_tensors(llama_dir))

    healed = snap.load(digest, device)
    assert healed.report.ram_tier_bytes == healed.report.tensor_bytes
    assert_same_tensors(healed, expected_tensors(llama_dir))


def _as_older_entry(entry: Path) -> None:
    """Rewrite an entry's meta.json as an older thaw wrote it: blake3 digests, no checksums."""
    doc = json.loads((entry / "meta.json").read_bytes())
    for i, f in enumerate(doc["files"]):
        del f["xxh3"]
        f["digest"] = digest_bytes((entry / f"{i}.data").read_bytes())
    doc["format"] = 1
    (entry / "meta.json").write_text(json.dumps(doc))


def test_an_older_entry_is_checked_with_its_digests_once_then_recorded(
    tmp_path: Path, llama_dir: Path, tier_config: RamTierConfig
) -> None:
    snap, tier, digest = _held(tmp_path, llama_dir, tier_config)
    _as_older_entry(tier.entry_dir(digest))

    held = snap.load(digest)
    assert held.report.ram_tier_bytes == held.report.tensor_bytes
    assert_same_tensors(held, expected_tensors(llama_dir))
    assert (tier.counters().rehashed, tier.counters().corrupt) == (1, 0)
    meta = json.loads((tier.entry_dir(digest) / "meta.json").read_bytes())
    assert meta["format"] == 3 and all("piece_bytes" in f for f in meta["files"])

    assert snap.load(digest).report.ram_tier_bytes == held.report.tensor_bytes
    assert tier.counters().rehashed == 1  # recorded: the next hit checks checksums


def test_a_corrupt_older_entry_is_caught_by_its_digests(
    tmp_path: Path, llama_dir: Path, tier_config: RamTierConfig
) -> None:
    snap, tier, digest = _held(tmp_path, llama_dir, tier_config)
    _as_older_entry(tier.entry_dir(digest))
    _flip_byte(max(tier.entry_dir(digest).glob("*.data"), key=lambda f: f.stat().st_size))

    fallback = snap.load(digest)
    assert (tier.counters().corrupt, tier.counters().rehashed) == (1, 0)
    assert fallback.report.ram_tier_bytes == 0
    assert_same_tensors(fallback, expected_tensors(llama_dir))


def test_without_verify_a_hit_hashes_nothing(
    tmp_path: Path, llama_dir: Path, tier_config: RamTierConfig
) -> None:
    registry = Registry(LocalStore(tmp_path / "store"))
    digest = push(registry, llama_dir, "llama:v1")
    config = RamTierConfig(tier_config.directory, tier_config.max_bytes, verify=False)
    snap = Snapshotter(registry, _cache(tmp_path / "cache"), ram_tier=RamTier(config))
    snap.load(digest)
    held = snap.load(digest)
    assert held.report.ram_tier_bytes == held.report.tensor_bytes
    assert held.report.verify_decompress.bytes == 0


def test_a_full_tmpfs_skips_the_insert_and_the_load_succeeds(
    tmp_path: Path, llama_dir: Path, tier_config: RamTierConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = Registry(LocalStore(tmp_path / "store"))
    digest = push(registry, llama_dir, "llama:v1")
    tier = RamTier(tier_config)
    snap = Snapshotter(registry, _cache(tmp_path / "cache"), ram_tier=tier)

    def no_space(fd: int, data: memoryview) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("snapshotter.ram_tier_entry._write_all", no_space)
    tensors = snap.load(digest)
    assert_same_tensors(tensors, expected_tensors(llama_dir))
    assert tier.counters().insert_errors == 1
    assert list(tier.entries_dir.iterdir()) == []  # the partial entry was removed
    assert digest not in tier and snap.load(digest).report.ram_tier_bytes == 0


def test_a_tier_directory_emptied_under_a_running_worker_is_started_again(
    tmp_path: Path, llama_dir: Path, tier_config: RamTierConfig
) -> None:
    snap, tier, digest = _held(tmp_path, llama_dir, tier_config)
    shutil.rmtree(tier_config.directory)  # e.g. an operator cleaned /dev/shm

    assert tier.inventory().total_bytes == 0
    assert snap.load(digest).report.ram_tier_bytes == 0  # a miss, then kept again
    assert snap.load(digest).report.ram_tier_bytes > 0


def test_concurrent_first_loads_keep_one_entry(
    tmp_path: Path, llama_dir: Path, tier_config: RamTierConfig
) -> None:
    registry = Registry(LocalStore(tmp_path / "store"))
    digest = push(registry, llama_dir, "llama:v1")
    tier = RamTier(tier_config)
    errors: list[BaseException] = []

    def load(i: int) -> None:
        try:
            Snapshotter(registry, _cache(tmp_path / f"cache{i}"), ram_tier=tier).load(digest)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=load, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert list(tier.inventory().manifests) == [digest]
    assert tier.counters().inserts == 1
    assert [p.name for p in tier.entries_dir.iterdir()] == [hex_part(digest)]  # no debris


# --- settings -------------------------------------------------------------------


def test_from_settings_wires_the_ram_tier(tmp_path: Path, tier_config: RamTierConfig) -> None:
    settings = Settings(
        home=tmp_path,
        ram_tier_dir=tier_config.directory,
        ram_tier_max_bytes=1 << 20,
        ram_tier_verify=False,
    )
    snap = Snapshotter.from_settings(settings)
    assert snap.ram_tier is not None
    assert snap.ram_tier.config == RamTierConfig(tier_config.directory, 1 << 20, verify=False)
    assert snap.source.cache is not None
    assert Snapshotter.from_settings(Settings(home=tmp_path, ram_tier_max_bytes=0)).ram_tier is None


def test_default_ram_tier_is_shared_memory_named_by_home(tmp_path: Path) -> None:
    a = Settings(home=tmp_path / "a").ram_tier_config()
    b = Settings(home=tmp_path / "b").ram_tier_config()
    assert a.directory != b.directory
    assert a.directory == Settings(home=tmp_path / "a").ram_tier_config().directory
    if _SHM.is_dir():
        assert a.directory.parent == _SHM and a.directory.name.startswith("thaw-")
    physical_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert a.max_bytes == physical_bytes // 4
    assert a.verify
    assert a.remove_when_unused  # thaw chose it: the home's last worker removes it


def test_a_ram_tier_directory_set_by_the_user_is_never_removed_by_thaw(tmp_path: Path) -> None:
    config = Settings(home=tmp_path, ram_tier_dir=tmp_path / "mine").ram_tier_config()
    assert config.directory == tmp_path / "mine"
    assert not config.remove_when_unused


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_second_start_from_the_ram_tier(
    tmp_path: Path, llama_dir: Path, tier_config: RamTierConfig
) -> None:
    registry, store = counting_registry(StoreConfig(url=str(tmp_path / "store")))
    digest = push(registry, llama_dir, "llama:v1")
    Snapshotter(registry, _cache(tmp_path / "c1"), ram_tier=RamTier(tier_config)).load(
        digest, "cuda"
    )
    store.reset()
    snap = Snapshotter(registry, _cache(tmp_path / "c2"), ram_tier=RamTier(tier_config))
    second = snap.load(digest, "cuda")
    assert store.gets == []
    assert second.report.ram_tier_bytes == second.report.place.bytes == second.report.tensor_bytes
    assert all(t.device.type == "cuda" for t in second.values())
    assert_same_tensors(second, expected_tensors(llama_dir))


def test_pieces_are_checked_at_once_and_the_first_bad_one_is_named() -> None:
    piece = 4096
    buffers = [torch.randint(0, 256, (n,), dtype=torch.uint8) for n in (4096, 70_000, 300)]
    meta = [
        TierFile(f"f{i}.safetensors", b.numel(), _piece_checksums(b, piece), piece_bytes=piece)
        for i, b in enumerate(buffers)
    ]
    assert [len(f.pieces()) for f in meta] == [1, 18, 1]
    assert check_files(meta, buffers) == meta
    buffers[2][0] ^= 1
    buffers[1][50_000] ^= 1
    with pytest.raises(
        BadEntry, match=r"f1\.safetensors does not match its checksum \(bytes 49152-53248\)"
    ):
        check_files(meta, buffers)


def _piece_checksums(buf: torch.Tensor, piece: int) -> tuple[int, ...]:
    view = bytes_view(buf)
    return tuple(checksum_bytes(view[b : b + piece]) for b in range(0, len(view), piece))


def test_an_entry_with_one_checksum_per_file_is_still_checked(
    tmp_path: Path, llama_dir: Path, tier_config: RamTierConfig
) -> None:
    """Format 2 (an older thaw): one xxh3 per file, a one-piece file."""
    snap, tier, digest = _held(tmp_path, llama_dir, tier_config)
    entry = tier.entry_dir(digest)
    doc = json.loads((entry / "meta.json").read_bytes())
    for i, f in enumerate(doc["files"]):
        del f["piece_bytes"]
        f["xxh3"] = f"{checksum_bytes((entry / f'{i}.data').read_bytes()):016x}"
    doc["format"] = 2
    (entry / "meta.json").write_text(json.dumps(doc))

    held = snap.load(digest)
    assert held.report.ram_tier_bytes == held.report.tensor_bytes
    assert_same_tensors(held, expected_tensors(llama_dir))
    _flip_byte(max(entry.glob("*.data"), key=lambda f: f.stat().st_size))
    assert snap.load(digest).report.ram_tier_bytes == 0
    assert tier.counters().corrupt == 1


def test_a_prewarmed_process_reads_and_plans_no_manifest_at_its_first_load(
    store_config: StoreConfig,
    tmp_path: Path,
    llama_dir: Path,
    tier_config: RamTierConfig,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    registry, store = counting_registry(store_config)
    push(registry, llama_dir, "llama:v1")
    Snapshotter(registry, _cache(tmp_path / "c1"), ram_tier=RamTier(tier_config)).load("llama:v1")

    tier = RamTier(tier_config)
    reads: list[str] = []
    plans: list[int] = []
    get_manifest, plan_load = tier.get_manifest, loader_module.plan_load
    monkeypatch.setattr(tier, "get_manifest", lambda d: reads.append(d) or get_manifest(d))
    monkeypatch.setattr(loader_module, "plan_load", lambda *a: plans.append(1) or plan_load(*a))
    snap = Snapshotter(registry, _cache(tmp_path / "c2"), ram_tier=tier)
    snap.prewarm("cpu")  # as a pool process does while it waits
    assert len(reads) == len(plans) == 1  # the tier's entry, parsed and planned ahead

    reads.clear()
    plans.clear()
    store.reset()
    loaded = snap.load("llama:v1")
    assert reads == [] and plans == []  # nothing read or planned again
    assert store.gets == ["tags/llama/v1"]  # the tag is still read: tags move
    assert loaded.report.ram_tier_bytes == loaded.report.tensor_bytes > 0
    assert_same_tensors(loaded, expected_tensors(llama_dir))

    # The tag moved to other weights: the load follows it.
    other = tmp_path / "other"
    shutil.copytree(llama_dir, other)
    shard = sorted(other.glob("*.safetensors"))[0]
    tensors = load_file(shard)
    name = sorted(tensors)[0]
    tensors[name] = tensors[name] + 1
    save_file(tensors, shard, metadata={"format": "pt"})
    push(registry, other, "llama:v1")
    moved = snap.load("llama:v1")
    assert_same_tensors(moved, expected_tensors(other))


def test_manifests_kept_parsed_are_the_most_recently_used_few() -> None:
    kept = loader_module._Parsed(2)
    a, b, c = (object(), object(), object())
    kept.put("a", a)  # type: ignore[arg-type]
    kept.put("b", b)  # type: ignore[arg-type]
    assert kept.get("a") == (a, None)  # used: "b" is now the oldest
    kept.put("c", c)  # type: ignore[arg-type]
    assert kept.get("b") is None and kept.get("a") == (a, None) and kept.get("c") == (c, None)
    plan = object()
    kept.put("a", a, plan)  # type: ignore[arg-type]
    kept.put("a", a)  # type: ignore[arg-type]
    assert kept.get("a") == (a, plan)  # a plan made once stays
