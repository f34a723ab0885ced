"""Leases in a real local store: written, refreshed, released; when a load takes one."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from snapshotter.cache import DiskCache
from snapshotter.config import CacheConfig, LoaderConfig
from snapshotter.digest import digest_bytes
from snapshotter.errors import IntegrityError
from snapshotter.leases import Lease, LeaseKeeper, active_leases, read_leases
from snapshotter.loader import Snapshotter
from snapshotter.registry import Registry
from snapshotter.stores.base import Store
from snapshotter.stores.local import LocalStore
from tests.snapshotter.loadkit import push


class PutRecorder(Store):
    """A real local store that remembers the keys written to it."""

    def __init__(self, inner: Store) -> None:
        self.inner, self.url = inner, inner.url
        self.puts: list[str] = []
        self.last_put: bytes = b""
        self._lock = threading.Lock()

    def put(self, key: str, data: bytes | memoryview) -> None:
        with self._lock:
            self.puts.append(key)
            self.last_put = bytes(data)
        self.inner.put(key, data)

    def get(self, key: str) -> bytes:
        return self.inner.get(key)

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def list(self, prefix: str) -> Iterator[str]:
        return self.inner.list(prefix)


def test_protect_is_in_the_store_on_return_and_exit_releases(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    manifest, chunk = digest_bytes(b"m"), digest_bytes(b"c")
    with LeaseKeeper(store, "push x:v1", ttl_s=60, manifests=[manifest]) as keeper:
        [lease] = read_leases(store)
        assert lease.manifests == {manifest} and lease.holder == "push x:v1"
        keeper.protect(chunks=[chunk])
        [lease] = read_leases(store)
        assert lease.chunks == {chunk} and lease.expires_at_s > time.time() + 30
    assert read_leases(store) == []


def test_added_digests_reach_the_store_within_the_flush_interval(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    chunk = digest_bytes(b"c")
    with LeaseKeeper(store, "push", ttl_s=60, flush_interval_s=0.05) as keeper:
        keeper.add(chunks=[chunk])
        deadline = time.monotonic() + 30
        while chunk not in read_leases(store)[0].chunks:
            assert time.monotonic() < deadline, "the lease never named the added chunk"
            time.sleep(0.01)


def test_expired_leases_protect_nothing_and_bad_ones_stop_the_reader(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    old = Lease("old", "push", expires_at_s=100.0)
    live = Lease("live", "load", expires_at_s=300.0)
    for lease in (old, live):
        store.put(lease.key, lease.to_json())
    assert [lease.id for lease in active_leases(read_leases(store), now_s=200.0)] == ["live"]
    store.put("leases/bad.json", b"{not json")
    with pytest.raises(IntegrityError, match=r"leases/bad\.json"):
        read_leases(store)


def test_a_load_from_the_store_leases_its_manifest_and_a_cached_one_writes_nothing(
    tmp_path: Path, llama_dir: Path
) -> None:
    recorder = PutRecorder(LocalStore(tmp_path / "store"))
    registry = Registry(recorder)
    digest = push(registry, llama_dir, "m:v1")
    cache_config = CacheConfig(directory=tmp_path / "cache")
    config = LoaderConfig(lease_ttl_s=60)
    recorder.puts.clear()

    Snapshotter(registry, DiskCache(cache_config), config).load("m:v1")
    [lease_key] = recorder.puts  # written once, deleted after
    assert lease_key.startswith("leases/") and not recorder.exists(lease_key)
    assert Lease.from_json(recorder.last_put).manifests == {digest}
    recorder.puts.clear()
    Snapshotter(registry, DiskCache(cache_config), config).load("m:v1")
    assert recorder.puts == []  # every chunk cached: no store write at all
