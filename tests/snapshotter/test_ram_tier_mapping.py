"""How a RAM-tier hit maps its weights: populated in one call, shared between replicas,
copy-on-write for the function's writes, read-only and shared for a copy to CUDA.

Sharing is read from the kernel's own accounting (``/proc/PID/smaps``) of the
mappings of the tier's files, never from timings: Rss (pages mapped), Pss (the
process's proportional share of them) and Anonymous (pages copied on write into
the process's own memory). Private_* is no measure of copies here: a tmpfs page
mapped by one process only counts as private dirty.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from snapshotter import DiskCache, Snapshotter, pages, ram_tier_entry
from snapshotter.config import CacheConfig, RamTierConfig
from snapshotter.ram_tier import RamTier
from snapshotter.registry import Registry
from snapshotter.stores.local import LocalStore
from tests.snapshotter.loadkit import assert_same_tensors, expected_tensors, push

REPO_ROOT = Path(__file__).resolve().parents[2]
_SHM = Path("/dev/shm")
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


@pytest.fixture
def tier_config() -> Iterator[RamTierConfig]:
    parent = _SHM if _SHM.is_dir() else None
    directory = Path(tempfile.mkdtemp(prefix="thaw-test-ram-", dir=parent))
    yield RamTierConfig(directory=directory, max_bytes=256 << 20, verify=False)
    shutil.rmtree(directory, ignore_errors=True)


def tier_mapping_kb(root: Path, pid: int | str = "self") -> dict[str, int]:
    """Rss, Pss, Anonymous (kB) of a process's mappings of the tier's files, summed; and
    ``mappings``, how many there are."""
    keys = ("Rss", "Pss", "Anonymous")
    out = dict.fromkeys(keys, 0) | {"mappings": 0}
    inside = False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            first = line.split(None, 1)[0]
            if not first.endswith(":"):  # a mapping's header line
                inside = str(root) in line
                out["mappings"] += inside
            elif inside and first[:-1] in keys:
                out[first[:-1]] += int(line.split()[1])
    return out


@pytest.fixture
def held(
    tmp_path: Path, llama_dir: Path, tier_config: RamTierConfig
) -> Iterator[tuple[Snapshotter, str]]:
    """A loader whose tier holds the model (put by a first load in another loader)."""
    registry = Registry(LocalStore(tmp_path / "store"))
    digest = push(registry, llama_dir, "llama:v1")
    cache = DiskCache(CacheConfig(tmp_path / "cache"))
    Snapshotter(registry, cache, ram_tier=RamTier(tier_config)).load(digest)
    yield Snapshotter(registry, cache, ram_tier=RamTier(tier_config)), digest


def test_a_hit_is_populated_in_one_call_without_verify(
    held: tuple[Snapshotter, str], tier_config: RamTierConfig, llama_dir: Path
) -> None:
    snap, digest = held
    tensors = snap.load(digest)
    assert tensors.report.ram_tier_bytes == tensors.report.tensor_bytes
    assert tensors.report.verify_decompress.bytes == 0  # nothing read the pages yet
    used = tier_mapping_kb(tier_config.directory)
    # Every page is mapped already (no fault left for the first forward pass) ...
    assert used["Rss"] * 1024 >= tensors.report.tensor_bytes
    # ... and none of them is this process's own copy.
    assert used["Anonymous"] == 0
    assert_same_tensors(tensors, expected_tensors(llama_dir))


def test_a_checked_hit_is_populated_by_its_checks(
    tmp_path: Path, llama_dir: Path, tier_config: RamTierConfig
) -> None:
    # With verify on, the threads that check the pieces map their pages first: every
    # byte counted as checked, every page mapped, and still none this process's own.
    checked = dataclasses.replace(tier_config, verify=True)
    registry = Registry(LocalStore(tmp_path / "store"))
    digest = push(registry, llama_dir, "llama:v1")
    cache = DiskCache(CacheConfig(tmp_path / "cache"))
    Snapshotter(registry, cache, ram_tier=RamTier(checked)).load(digest)
    tensors = Snapshotter(registry, cache, ram_tier=RamTier(checked)).load(digest)
    assert tensors.report.ram_tier_bytes == tensors.report.tensor_bytes
    assert tensors.report.verify_decompress.bytes == tensors.report.tensor_bytes
    used = tier_mapping_kb(checked.directory)
    assert used["Rss"] * 1024 >= tensors.report.tensor_bytes
    assert used["Anonymous"] == 0
    assert_same_tensors(tensors, expected_tensors(llama_dir))


def test_without_populate_the_pages_fault_in_later(
    held: tuple[Snapshotter, str], tier_config: RamTierConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A kernel before 5.14 refuses the advice (EINVAL): the hit still maps, lazily.
    monkeypatch.setattr(pages, "MADV_POPULATE_READ", 0x7FFF)
    snap, digest = held
    tensors = snap.load(digest)
    assert tensors.report.ram_tier_bytes == tensors.report.tensor_bytes
    assert tier_mapping_kb(tier_config.directory)["Rss"] * 1024 < tensors.report.tensor_bytes


def test_a_write_copies_only_the_page_it_touches(
    held: tuple[Snapshotter, str], tier_config: RamTierConfig, llama_dir: Path
) -> None:
    snap, digest = held
    tensors = snap.load(digest)
    name, weight = max(tensors.items(), key=lambda kv: kv[1].numel())
    weight.view(-1)[0] += 1  # one element: one page copied, private to this replica
    used = tier_mapping_kb(tier_config.directory)
    assert used["Anonymous"] * 1024 == _PAGE_BYTES
    assert not torch.equal(weight, expected_tensors(llama_dir)[name])

    again = snap.load(digest)  # the tier and the next replica see the original bytes
    assert again.report.ram_tier_bytes == again.report.tensor_bytes
    assert_same_tensors(again, expected_tensors(llama_dir))


_REPLICA = """
import json, sys
from pathlib import Path
from snapshotter import DiskCache, Snapshotter
from snapshotter.config import CacheConfig, RamTierConfig
from snapshotter.ram_tier import RamTier
from snapshotter.registry import Registry
from snapshotter.stores.local import LocalStore

args = json.loads(sys.argv[1])
tier = RamTier(RamTierConfig(Path(args["tier"]), max_bytes=256 << 20, verify=False))
snap = Snapshotter(Registry(LocalStore(Path(args["store"]))),
                   DiskCache(CacheConfig(Path(args["cache"]))), ram_tier=tier)
tensors = snap.load(args["digest"])
print(json.dumps({"ram_tier_bytes": tensors.report.ram_tier_bytes}), flush=True)
sys.stdin.readline()  # hold the tensors while the parent looks
"""


def test_two_replicas_share_the_tiers_pages(
    held: tuple[Snapshotter, str], tier_config: RamTierConfig, tmp_path: Path
) -> None:
    snap, digest = held
    tensors = snap.load(digest)
    alone = tier_mapping_kb(tier_config.directory)
    args = {
        "tier": str(tier_config.directory),
        "store": str(tmp_path / "store"),
        "cache": str(tmp_path / "child-cache"),
        "digest": digest,
    }
    child = subprocess.Popen(
        [sys.executable, "-c", _REPLICA, json.dumps(args)],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        loaded = json.loads(child.stdout.readline())
        mine = tier_mapping_kb(tier_config.directory)
        theirs = tier_mapping_kb(tier_config.directory, child.pid)
    finally:
        child.communicate("\n", timeout=60)
    assert loaded["ram_tier_bytes"] == tensors.report.tensor_bytes
    assert alone["Rss"] * 1024 >= tensors.report.tensor_bytes
    # The same pages in both: each process's proportional share of them is about half.
    assert theirs["Rss"] == mine["Rss"] == alone["Rss"]
    assert mine["Pss"] <= 0.55 * alone["Pss"] and theirs["Pss"] <= 0.55 * alone["Pss"]
    assert mine["Anonymous"] == theirs["Anonymous"] == 0


def test_a_read_only_shared_mapping_for_the_copy_to_a_device(
    held: tuple[Snapshotter, str], tier_config: RamTierConfig
) -> None:
    snap, digest = held
    assert snap.ram_tier is not None
    entry = snap.ram_tier.entry_dir(digest)
    path = max(entry.glob("*.data"), key=lambda p: p.stat().st_size)
    buf = ram_tier_entry.map_file(path, path.stat().st_size, read_only=True)  # no warning
    assert bytes(ram_tier_entry.bytes_view(buf)) == path.read_bytes()
    with open("/proc/self/maps") as f:
        perms = [line.split()[1] for line in f if str(path) in line]
    assert perms == ["r--s"]  # readable only, shared: pinning it copies nothing


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_copies_the_registered_tier_pages_with_no_copy_on_the_host(
    held: tuple[Snapshotter, str], tier_config: RamTierConfig
) -> None:
    from snapshotter.loader_cuda import copy_registered

    snap, digest = held
    assert snap.ram_tier is not None
    entry = snap.ram_tier.entry_dir(digest)
    paths = [p for p in sorted(entry.glob("*.data")) if p.stat().st_size > 0]
    host = [ram_tier_entry.map_file(p, p.stat().st_size, read_only=True) for p in paths]
    out = copy_registered(host, torch.device("cuda"))
    assert out is not None  # registered, not staged
    for src, dst in zip(host, out, strict=True):
        assert dst.is_cuda and torch.equal(dst.cpu(), src)
    # Pinning a read-only shared mapping pins the tier's pages: none copied for this process.
    assert tier_mapping_kb(tier_config.directory)["Anonymous"] == 0
