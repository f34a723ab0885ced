"""Storage faults (issue 7, items 11 to 14), against a local directory and S3 (moto server).

11 a flipped byte in a chunk, in the store, in the worker's disk cache and in its RAM
   tier (here through the loader and the CLI; through real worker cold starts in
   ``test_storage_coldstart``)
12 a `thaw models push` SIGKILLed halfway, then run again
13 `thaw gc` during a push, during a load, and SIGKILLed halfway
14 the worker's cache disk fills during a load: ``test_storage_cache_full``
"""

from __future__ import annotations

import io
import os
import re
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from snapshotter import cache_entry, codec
from snapshotter.cache import DiskCache
from snapshotter.config import CacheConfig, LoaderConfig, RamTierConfig, StoreConfig
from snapshotter.digest import digest_bytes
from snapshotter.errors import IntegrityError, NotFoundError
from snapshotter.gc import PLAN_PREFIX, plan_gc, sweep
from snapshotter.images import push_image_archive
from snapshotter.layers import get_layer
from snapshotter.leases import Lease
from snapshotter.loader import Snapshotter
from snapshotter.manifest import ChunkRef
from snapshotter.push import PushResult, push_directory
from snapshotter.ram_tier import RamTier
from snapshotter.registry import Registry, chunk_key
from snapshotter.stores import open_store
from snapshotter.stores.local import LocalStore
from tests.faults.storage_kit import (
    WAIT_S,
    GatedStore,
    assert_pulls_whole,
    chunk_keys,
    cli_env,
    leased_chunks,
    put_garbage,
    thaw_popen,
    thaw_run,
    wait_until,
    write_random_model,
)
from tests.fixtures.images import Member, layer_tar, save_archive
from tests.snapshotter.loadkit import (
    TEST_CHUNK_SIZE_BYTES,
    assert_same_tensors,
    entry_payload_at,
    expected_tensors,
    push,
)


@pytest.fixture(scope="module")
def big_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_model(tmp_path_factory.mktemp("big") / "model")


def _gc(registry: Registry, grace_s: float = 0.0) -> set[str]:
    """One whole GC; returns the keys it deleted."""
    before = chunk_keys(registry)
    plan, roots, live = plan_gc(registry, grace_s=grace_s)
    sweep(registry, plan, roots, live)
    return before - chunk_keys(registry)


# --- 11: a flipped byte ------------------------------------------------------------------
def _flip_one_byte(data: bytes) -> bytes:
    at = len(data) - 3  # in the payload, past the frame header
    return data[:at] + bytes([data[at] ^ 0x40]) + data[at + 1 :]


def _tensor_chunk(registry: Registry, ref: str) -> ChunkRef:
    """A chunk that holds tensor bytes (not a header) of ``ref``."""
    manifest = registry.get_manifest(registry.resolve(ref))
    for f in manifest.safetensors_files():
        assert f.safetensors is not None
        for c in f.chunks:
            if c.offset >= f.safetensors.data_offset:
                return c
    raise AssertionError(f"{ref} has no tensor chunk")


def test_flipped_byte_in_the_cache_is_refetched_before_use(
    store_config: StoreConfig, llama_dir: Path, tmp_path: Path
) -> None:
    registry = Registry(open_store(store_config))
    push(registry, llama_dir, "m:v1")
    cache_config = CacheConfig(directory=tmp_path / "cache")
    Snapshotter(registry, DiskCache(cache_config)).load("m:v1")  # a first start fills the cache
    victim = _tensor_chunk(registry, "m:v1")
    entry = DiskCache(cache_config).path(victim.digest)
    entry.write_bytes(_flip_one_byte(entry.read_bytes()))

    loader = Snapshotter(registry, DiskCache(cache_config))  # the next start, a new process
    assert_same_tensors(loader.load("m:v1"), expected_tensors(llama_dir))
    counters = loader.source.counters()
    assert (counters.cache_corrupt, counters.store_gets) == (1, 1)  # only the bad chunk
    healed = cache_entry.decode(entry.read_bytes(), victim.size)
    assert digest_bytes(healed) == victim.digest  # the entry was replaced from the store


@pytest.fixture
def tier_config() -> Iterator[RamTierConfig]:
    """A RAM tier on the real tmpfs (/dev/shm) when there is one."""
    shm = Path("/dev/shm")
    directory = Path(tempfile.mkdtemp(prefix="thaw-faults-ram-", dir=shm if shm.is_dir() else None))
    yield RamTierConfig(directory=directory, max_bytes=256 << 20)
    shutil.rmtree(directory, ignore_errors=True)


def _damage(path: Path, at: int, how: str) -> None:
    """Flip the byte at ``at``, or cut the file there (tier files are read-only)."""
    os.chmod(path, 0o644)
    if how == "truncated":
        os.truncate(path, at)
        return
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x40]))


@pytest.mark.parametrize("how", ["flipped", "truncated"])
def test_damage_in_the_ram_tier_and_the_cache_is_fetched_again_from_the_store(
    store_config: StoreConfig, llama_dir: Path, tmp_path: Path, tier_config: RamTierConfig, how: str
) -> None:
    registry = Registry(open_store(store_config))
    push(registry, llama_dir, "m:v1")
    digest = registry.resolve("m:v1")
    cache_config = CacheConfig(directory=tmp_path / "cache")
    Snapshotter(registry, DiskCache(cache_config), ram_tier=RamTier(tier_config)).load("m:v1")
    manifest = registry.get_manifest(digest)
    victim = _tensor_chunk(registry, "m:v1")
    file_idx, file = next((i, f) for i, f in enumerate(manifest.files) if victim in f.chunks)
    assert file.safetensors is not None
    # The same bytes, damaged in both of the node's tiers: in /dev/shm and on the disk.
    tier_file = RamTier(tier_config).entry_dir(digest) / f"{file_idx}.data"
    _damage(tier_file, victim.offset - file.safetensors.data_offset + victim.size // 2, how)
    entry = DiskCache(cache_config).path(victim.digest)
    _damage(entry, entry_payload_at(entry) + victim.size // 2, how)

    tier = RamTier(tier_config)
    loader = Snapshotter(registry, DiskCache(cache_config), ram_tier=tier)  # a new process
    loaded = loader.load("m:v1")
    assert_same_tensors(loaded, expected_tensors(llama_dir))
    assert loaded.report.ram_tier_bytes == 0 and tier.counters().corrupt == 1
    counters = loader.source.counters()
    assert (counters.cache_corrupt, counters.store_gets) == (1, 1)  # only the bad chunk
    healed = cache_entry.decode(entry.read_bytes(), victim.size)
    assert digest_bytes(healed) == victim.digest
    again = Snapshotter(registry, DiskCache(cache_config), ram_tier=RamTier(tier_config))
    reheld = again.load("m:v1")  # the tier holds a good copy again
    assert reheld.report.ram_tier_bytes == reheld.report.tensor_bytes
    assert_same_tensors(reheld, expected_tensors(llama_dir))


def test_flipped_byte_in_the_store_is_a_clear_error_and_nothing_is_used(
    store_config: StoreConfig, llama_dir: Path, tmp_path: Path
) -> None:
    registry = Registry(open_store(store_config))
    push(registry, llama_dir, "m:v1")
    victim = _tensor_chunk(registry, "m:v1")
    registry.put_chunk(victim.digest, _flip_one_byte(registry.get_chunk(victim.digest)))
    cache = DiskCache(CacheConfig(directory=tmp_path / "cache"))

    with pytest.raises(IntegrityError) as info:
        Snapshotter(registry, cache).load("m:v1")
    assert "m:v1" in str(info.value) and victim.digest in str(info.value)
    assert victim.digest not in cache and not cache.path(victim.digest).exists()

    env = cli_env(store_config, tmp_path / "home")
    pulled = thaw_run(env, "models", "pull", "m:v1", str(tmp_path / "pulled"))
    assert pulled.returncode == 2 and victim.digest in pulled.stderr, pulled.stderr
    bad_file = next(
        f.path for f in registry.get_manifest(registry.resolve("m:v1")).files if victim in f.chunks
    )
    assert not (tmp_path / "pulled" / bad_file).exists()  # no file holding the bad bytes
    checked = thaw_run(env, "models", "verify", "m:v1")
    assert checked.returncode == 1 and f"bad chunk {victim.digest}" in checked.stderr
    assert "--delete-bad" in str(info.value)  # the error says how to repair

    # The repair the error names: drop the bad chunk, push again (it re-uploads only that).
    repaired = thaw_run(env, "models", "verify", "m:v1", "--delete-bad")
    assert repaired.returncode == 1 and "deleted 1 bad chunks" in repaired.stdout
    again = thaw_run(
        env,
        "models",
        "push",
        str(llama_dir),
        "m:v1",
        "--chunk-size-bytes",
        str(TEST_CHUNK_SIZE_BYTES),
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert thaw_run(env, "models", "verify", "m:v1").returncode == 0
    assert_same_tensors(Snapshotter(registry, cache).load("m:v1"), expected_tensors(llama_dir))


# --- 12: a push killed halfway -----------------------------------------------------------
@pytest.mark.slow
def test_push_killed_halfway_resumes_to_the_same_bytes(
    store_config: StoreConfig, big_model_dir: Path, tmp_path: Path
) -> None:
    registry = Registry(open_store(store_config))
    env = cli_env(store_config, tmp_path / "home")
    args = ("models", "push", str(big_model_dir), "big:v1", "--chunk-size-bytes", "4096")
    proc = thaw_popen(env, *args, "--threads", "1")
    try:
        wait_until(
            lambda: len(chunk_keys(registry)) >= 20 or proc.poll() is not None,
            "the push to write chunks",
        )
    finally:
        proc.send_signal(signal.SIGKILL)
        output = proc.communicate(timeout=WAIT_S)[0]
    written = chunk_keys(registry)
    with pytest.raises(NotFoundError):
        registry.resolve("big:v1")  # killed before its tag: not there at all
    assert written, output

    done = thaw_run(env, *args)
    assert done.returncode == 0, done.stdout + done.stderr
    skipped = re.search(r"deduplicated .* \((\d+) of (\d+) chunks\)", done.stdout)
    assert skipped is not None, done.stdout
    assert int(skipped[1]) >= len(written)  # every chunk the killed push wrote is reused
    clean = push_directory(
        big_model_dir, "big:v1", Registry(LocalStore(tmp_path / "clean")), chunk_size_bytes=4096
    )
    assert registry.resolve("big:v1") == clean.digest  # the same manifest, byte for byte
    assert_pulls_whole(registry, "big:v1", big_model_dir, tmp_path / "pulled")


# --- 13: garbage collection ---------------------------------------------------------------
def test_gc_during_a_push_deletes_nothing_the_push_relies_on(
    store_config: StoreConfig, llama_dir: Path, tmp_path: Path
) -> None:
    store = open_store(store_config)
    registry = Registry(store)
    # The same model pushed and untagged: garbage that the next push finds already stored.
    push(registry, llama_dir, "old:v1")
    registry.delete_tag("old:v1")
    garbage = put_garbage(registry, 10)
    gated = GatedStore(store, "exists", pass_first=4)
    pushed: list[PushResult] = []

    def run_push() -> None:
        pushed.append(
            push_directory(
                llama_dir,
                "new:v1",
                Registry(gated),
                chunk_size_bytes=TEST_CHUNK_SIZE_BYTES,
                threads=2,
            )
        )

    thread = threading.Thread(target=run_push)
    thread.start()
    try:
        assert gated.held.wait(WAIT_S)
        wait_until(lambda: len(leased_chunks(store)) >= 4, "the push's lease to name its chunks")
        leased = leased_chunks(store)
        deleted = _gc(registry, grace_s=0)  # the harshest GC: no grace at all
    finally:
        gated.release()
        thread.join(WAIT_S)
    assert pushed, "the push did not finish"
    assert garbage <= deleted
    assert not {k for k in deleted if k.rsplit("/", 1)[1] in {d[7:] for d in leased}}
    assert_pulls_whole(registry, "new:v1", llama_dir, tmp_path / "pulled")
    assert not _gc(registry, grace_s=0) & {k for k in chunk_keys(registry)}
    assert_pulls_whole(registry, "new:v1", llama_dir, tmp_path / "pulled-again")


def test_gc_during_a_load_keeps_what_the_loader_reads(
    store_config: StoreConfig, llama_dir: Path
) -> None:
    store = open_store(store_config)
    registry = Registry(store)
    push(registry, llama_dir, "m:v1")
    model_chunks = chunk_keys(registry)
    gated = GatedStore(store, "get", pass_first=3)
    loader = Snapshotter(Registry(gated), config=LoaderConfig(lease_ttl_s=30, fetch_threads=2))
    loaded: list[dict[str, torch.Tensor]] = []
    thread = threading.Thread(target=lambda: loaded.append(loader.load("m:v1")))
    thread.start()
    try:
        assert gated.held.wait(WAIT_S)
        registry.delete_tag("m:v1")  # the tag goes mid-load: only the load's lease holds it
        garbage = put_garbage(registry, 10)
        deleted = _gc(registry, grace_s=0)
    finally:
        gated.release()
        thread.join(WAIT_S)
    assert loaded, "the load did not finish"
    assert_same_tensors(loaded[0], expected_tensors(llama_dir))
    assert garbage <= deleted and not deleted & model_chunks
    # The load is over and its lease released: the same GC now takes the untagged model.
    assert _gc(registry, grace_s=0) == model_chunks


def test_gc_deletes_nothing_when_a_tagged_manifest_is_unreadable(
    store_config: StoreConfig, llama_dir: Path
) -> None:
    registry = Registry(open_store(store_config))
    digest = push(registry, llama_dir, "m:v1")
    garbage = put_garbage(registry, 3)
    registry.store.put("tags/junk/v1", b"not a digest")  # references nothing: ignored
    registry.store.put(f"manifests/{digest[len('blake3:') :]}", b'{"schema": "corrupt"}')
    with pytest.raises(IntegrityError, match="gc stopped before deleting anything"):
        _gc(registry, grace_s=0)
    assert garbage <= chunk_keys(registry)


def _objects(registry: Registry) -> set[str]:
    return {
        k for p in ("chunks/", "layers/", "images/", "profiles/") for k in registry.store.list(p)
    }


def test_gc_keeps_tagged_images_whole_and_sweeps_an_untagged_one(
    store_config: StoreConfig,
) -> None:
    registry = Registry(open_store(store_config))
    shared = layer_tar([Member("usr/bin/tool", data=b"shared tool " * 300)])
    only_a = layer_tar([Member("etc/a.conf", data=b"a settings " * 200)])
    only_b = layer_tar([Member("etc/b.conf", data=b"b settings " * 250)])
    a = push_image_archive(io.BytesIO(save_archive([shared, only_a])), "img-a:v1", registry)
    b = push_image_archive(io.BytesIO(save_archive([shared, only_b])), "img-b:v1", registry)
    for image in (a, b):
        registry.put_profile(image.digest, ["usr/bin/tool"])
    registry.store.delete("image-tags/img-b/v1")
    before = _objects(registry)

    b_only = {f"images/{b.digest[7:]}", f"profiles/{b.digest[7:]}", f"layers/{b.layers[1][7:]}"}
    b_only |= {
        chunk_key(c.digest) for e in get_layer(registry, b.layers[1]).entries for c in e.chunks
    }
    _gc(registry, grace_s=0)
    assert before - _objects(registry) == b_only
    assert registry.get_profile(a.digest) == ["usr/bin/tool"]
    for layer in a.layers:  # every chunk of every layer still reads back and verifies
        for entry in get_layer(registry, layer).entries:
            for c in entry.chunks:
                raw = codec.decode(registry.get_chunk(c.digest), c.size)
                assert digest_bytes(raw) == c.digest


@pytest.mark.slow
def test_gc_killed_halfway_deletes_nothing_referenced(
    store_config: StoreConfig, llama_dir: Path, tmp_path: Path
) -> None:
    registry = Registry(open_store(store_config))
    push(registry, llama_dir, "keep:v1")
    garbage = put_garbage(registry, 1500 if store_config.url.startswith("/") else 300)
    env = cli_env(store_config, tmp_path / "home")
    proc = thaw_popen(env, "gc", "--grace-s", "0", "--batch-size", "1")
    try:
        wait_until(
            lambda: len(garbage - chunk_keys(registry)) >= 5 or proc.poll() is not None,
            "gc to start deleting",
        )
    finally:
        proc.send_signal(signal.SIGKILL)
        output = proc.communicate(timeout=WAIT_S)[0]
    left = garbage & chunk_keys(registry)
    assert 0 < len(left) < len(garbage), f"gc was not stopped halfway: {output}"
    [plan] = list(registry.store.list(PLAN_PREFIX))
    assert b'"finished":false' in registry.store.get(plan)
    assert_pulls_whole(registry, "keep:v1", llama_dir, tmp_path / "pulled")
    # A push killed long ago left its lease; the next GC drops it once past the grace.
    stale = Lease("stale", "push dead:v1", expires_at_s=time.time() - 5)
    registry.store.put(stale.key, stale.to_json())

    done = thaw_run(env, "gc", "--grace-s", "0")
    assert done.returncode == 0, done.stdout + done.stderr
    assert not garbage & chunk_keys(registry)
    assert not registry.store.exists(stale.key)
    assert_pulls_whole(registry, "keep:v1", llama_dir, tmp_path / "pulled-again")


def test_gc_dry_run_lists_what_would_go_and_deletes_nothing(
    store_config: StoreConfig, llama_dir: Path, tmp_path: Path
) -> None:
    registry = Registry(open_store(store_config))
    push(registry, llama_dir, "keep:v1")
    garbage = put_garbage(registry, 3, size_bytes=2048)
    env = cli_env(store_config, tmp_path / "home")
    before = chunk_keys(registry)
    dry = thaw_run(env, "gc", "--grace-s", "0", "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert chunk_keys(registry) == before
    assert all(key in dry.stdout for key in garbage)
    assert "would delete 3 objects" in dry.stdout
    # Fresh garbage is inside the default grace period (1 h): nothing would go.
    kept = thaw_run(env, "gc", "--dry-run")
    assert "nothing would be deleted" in kept.stdout, kept.stdout
    # An untagged model kept by digest (--keep): only the garbage goes.
    kept_digest = registry.resolve("keep:v1")
    registry.delete_tag("keep:v1")
    swept = thaw_run(env, "gc", "--grace-s", "0", "--keep", kept_digest)
    assert re.search(r"deleted 3 objects", swept.stdout), swept.stdout + swept.stderr
    assert chunk_keys(registry) == before - garbage
    refused = thaw_run(env, "gc", "--keep", "llama:v1")
    assert refused.returncode == 2 and "is not a digest" in refused.stderr
