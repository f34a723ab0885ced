"""Helpers for the load-side tests: a store that counts gets, pushed artifacts, expectations."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors.torch import load_file

from snapshotter import cache_entry, codec
from snapshotter.config import StoreConfig
from snapshotter.digest import checksum_bytes
from snapshotter.push import push_directory
from snapshotter.registry import Registry
from snapshotter.stores import open_store
from snapshotter.stores.base import Store

# Small enough that the tiny Llama is cut into many chunks.
TEST_CHUNK_SIZE_BYTES = 16 << 10


class CountingStore(Store):
    """Delegates to a real store and remembers every ``get`` key, in call order."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.url = inner.url
        self.gets: list[str] = []
        self._lock = threading.Lock()

    def get(self, key: str) -> bytes:
        with self._lock:
            self.gets.append(key)
        return self.inner.get(key)

    def chunk_gets(self) -> list[str]:
        with self._lock:
            return [k for k in self.gets if k.startswith("chunks/")]

    def reset(self) -> None:
        with self._lock:
            self.gets.clear()

    def put(self, key: str, data: bytes | memoryview) -> None:
        self.inner.put(key, data)

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def list(self, prefix: str) -> Iterator[str]:
        return self.inner.list(prefix)


def counting_registry(config: StoreConfig) -> tuple[Registry, CountingStore]:
    store = CountingStore(open_store(config))
    return Registry(store), store


def push(registry: Registry, directory: Path, ref: str, *, convert: bool = True) -> str:
    """Push ``directory`` as ``ref`` in small chunks; returns the manifest digest.
    ``convert``: as ``push_directory``'s (False: a checkpoint's older form kept)."""
    pushed = push_directory(
        directory, ref, registry, chunk_size_bytes=TEST_CHUNK_SIZE_BYTES, convert=convert
    )
    return pushed.digest


def expected_tensors(directory: Path) -> dict[str, torch.Tensor]:
    """What ``safetensors.torch.load_file`` gives for every shard of a directory."""
    out: dict[str, torch.Tensor] = {}
    for path in sorted(directory.glob("*.safetensors")):
        out.update(load_file(path))
    return out


def assert_same_tensors(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(want)
    for name, expected in want.items():
        actual = got[name]
        assert actual.dtype == expected.dtype, name
        assert actual.shape == expected.shape, name
        assert torch.equal(actual.cpu(), expected), name


def entry_payload_at(entry: Path) -> int:
    """Where a disk-cache entry's payload starts (after its header and any padding)."""
    data = entry.read_bytes()
    return cache_entry.parse(data, codec.HEADER.unpack_from(data)[2])[0].header_bytes


def assert_entry_holds(entry: Path, raw: bytes) -> None:
    """The entry is the loader's kind: current format, raw, ``raw`` with its checksum."""
    data = entry.read_bytes()
    header, payload = cache_entry.parse(data, len(raw))
    assert data[:4] == cache_entry.MAGIC
    assert header.codec is codec.Codec.RAW
    assert header.checksum == checksum_bytes(raw)
    assert bytes(payload) == raw
