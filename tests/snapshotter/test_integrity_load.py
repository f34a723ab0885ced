"""Integrity on load: corrupt cache entries heal from the store; corrupt stores fail loudly.

A cache hit is checked with the checksum its entry recorded; an entry from an
older thaw (none recorded) with the chunk digest, once, then recorded.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import zstandard
from safetensors.torch import save_file

from snapshotter import cache_entry, codec
from snapshotter.cache import DiskCache
from snapshotter.config import CacheConfig, StoreConfig
from snapshotter.errors import ChunkTooLargeError, IntegrityError
from snapshotter.loader import Snapshotter
from snapshotter.manifest import ChunkRef
from snapshotter.registry import Registry, chunk_key
from tests.snapshotter.loadkit import (
    assert_entry_holds,
    assert_same_tensors,
    counting_registry,
    entry_payload_at,
    expected_tensors,
    push,
)


def _tensor_chunks(registry: Registry, digest: str, codec_label: str) -> list[ChunkRef]:
    """Chunks holding tensor data (not a header) with the given codec."""
    manifest = registry.get_manifest(digest)
    out = []
    for f in manifest.safetensors_files():
        assert f.safetensors is not None
        out += [
            c
            for c in f.chunks
            if c.offset >= f.safetensors.data_offset and c.codec == codec_label and c.size > 64
        ]
    return out


def _flip_byte(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :]


def _compressible_model(directory: Path) -> Path:
    directory.mkdir()
    pattern = torch.arange(64, dtype=torch.float32).repeat(256, 4)
    save_file({"a": pattern, "b": torch.zeros(128, 128)}, directory / "model.safetensors")
    return directory


def test_flipped_byte_in_cache_is_dropped_and_refetched(
    store_config: StoreConfig, tmp_path: Path, llama_dir: Path
) -> None:
    registry, store = counting_registry(store_config)
    digest = push(registry, llama_dir, "llama:v1")
    cache = DiskCache(CacheConfig(directory=tmp_path / "cache"))
    Snapshotter(registry, cache).load("llama:v1")  # fills the cache
    victim = _tensor_chunks(registry, digest, "raw")[0]
    entry = cache.path(victim.digest)
    flip_at = entry_payload_at(entry) + victim.size // 2
    entry.write_bytes(_flip_byte(entry.read_bytes(), flip_at))

    store.reset()
    snap = Snapshotter(registry, DiskCache(CacheConfig(directory=tmp_path / "cache")))
    tensors = snap.load("llama:v1")
    assert_same_tensors(tensors, expected_tensors(llama_dir))
    assert store.chunk_gets() == [chunk_key(victim.digest)]
    assert snap.source.counters().cache_corrupt == 1
    assert_entry_holds(entry, codec.decode(registry.get_chunk(victim.digest), victim.size))


def _as_older_entry(path: Path, size: int) -> None:
    """Rewrite a cache entry as an older thaw wrote it: the store's raw frame, no checksum."""
    raw = path.read_bytes()[entry_payload_at(path) :]
    assert len(raw) == size
    path.write_bytes(codec.HEADER.pack(codec.MAGIC, codec.Codec.RAW, size) + raw)


def test_a_wrong_recorded_checksum_is_refetched(
    store_config: StoreConfig, tmp_path: Path, llama_dir: Path
) -> None:
    registry, store = counting_registry(store_config)
    digest = push(registry, llama_dir, "llama:v1")
    Snapshotter(registry, DiskCache(CacheConfig(directory=tmp_path / "cache"))).load(digest)
    victim = _tensor_chunks(registry, digest, "raw")[0]
    entry = DiskCache(CacheConfig(directory=tmp_path / "cache")).path(victim.digest)
    entry.write_bytes(_flip_byte(entry.read_bytes(), codec.HEADER_SIZE))  # the checksum field

    store.reset()
    snap = Snapshotter(registry, DiskCache(CacheConfig(directory=tmp_path / "cache")))
    assert_same_tensors(snap.load(digest), expected_tensors(llama_dir))
    assert store.chunk_gets() == [chunk_key(victim.digest)]
    assert snap.source.counters().cache_corrupt == 1


def test_an_older_entry_is_checked_with_its_digest_once_then_recorded(
    store_config: StoreConfig, tmp_path: Path, llama_dir: Path
) -> None:
    registry, store = counting_registry(store_config)
    digest = push(registry, llama_dir, "llama:v1")
    cache_dir = tmp_path / "cache"
    Snapshotter(registry, DiskCache(CacheConfig(directory=cache_dir))).load(digest)
    older = _tensor_chunks(registry, digest, "raw")[:3]
    for c in older:
        _as_older_entry(DiskCache(CacheConfig(directory=cache_dir)).path(c.digest), c.size)

    store.reset()
    first = Snapshotter(registry, DiskCache(CacheConfig(directory=cache_dir)))
    assert_same_tensors(first.load(digest), expected_tensors(llama_dir))
    assert store.chunk_gets() == []
    counters = first.source.counters()
    assert (counters.cache_rehashed, counters.cache_corrupt) == (len(older), 0)
    cache = DiskCache(CacheConfig(directory=cache_dir))
    for c in older:  # now recorded, as the loader writes entries
        assert cache.path(c.digest).read_bytes()[:4] == cache_entry.MAGIC

    again = Snapshotter(registry, cache)
    assert_same_tensors(again.load(digest), expected_tensors(llama_dir))
    assert again.source.counters().cache_rehashed == 0


def test_a_corrupt_older_entry_is_caught_by_its_digest_and_refetched(
    store_config: StoreConfig, tmp_path: Path, llama_dir: Path
) -> None:
    registry, store = counting_registry(store_config)
    digest = push(registry, llama_dir, "llama:v1")
    cache_dir = tmp_path / "cache"
    Snapshotter(registry, DiskCache(CacheConfig(directory=cache_dir))).load(digest)
    victim = _tensor_chunks(registry, digest, "raw")[0]
    entry = DiskCache(CacheConfig(directory=cache_dir)).path(victim.digest)
    _as_older_entry(entry, victim.size)
    entry.write_bytes(_flip_byte(entry.read_bytes(), codec.HEADER_SIZE + 5))

    store.reset()
    snap = Snapshotter(registry, DiskCache(CacheConfig(directory=cache_dir)))
    assert_same_tensors(snap.load(digest), expected_tensors(llama_dir))
    assert store.chunk_gets() == [chunk_key(victim.digest)]
    counters = snap.source.counters()
    assert (counters.cache_corrupt, counters.cache_rehashed) == (1, 0)
    assert_entry_holds(entry, codec.decode(registry.get_chunk(victim.digest), victim.size))


def test_compressed_chunk_is_cached_decoded_and_heals_when_corrupt(tmp_path: Path) -> None:
    from snapshotter.stores.local import LocalStore

    model = _compressible_model(tmp_path / "zeros")
    registry = Registry(LocalStore(tmp_path / "store"))
    digest = push(registry, model, "zeros:v1")
    victim = _tensor_chunks(registry, digest, "zstd")[0]
    cache = DiskCache(CacheConfig(directory=tmp_path / "cache"))
    Snapshotter(registry, cache).load("zeros:v1")
    entry = cache.path(victim.digest)
    header, payload = cache_entry.parse(entry.read_bytes(), victim.size)
    assert (header.codec, len(payload)) == (codec.Codec.RAW, victim.size)  # stored decoded
    entry.write_bytes(_flip_byte(entry.read_bytes(), len(entry.read_bytes()) - 2))

    snap = Snapshotter(registry, cache)
    assert_same_tensors(snap.load("zeros:v1"), expected_tensors(model))
    assert snap.source.counters().cache_corrupt == 1
    assert snap.source.counters().store_gets == 1


def test_flipped_byte_in_store_raises_naming_artifact_and_chunk(
    store_config: StoreConfig, tmp_path: Path, llama_dir: Path
) -> None:
    registry, _ = counting_registry(store_config)
    digest = push(registry, llama_dir, "llama:v1")
    victim = _tensor_chunks(registry, digest, "raw")[0]
    obj = registry.get_chunk(victim.digest)
    registry.put_chunk(victim.digest, _flip_byte(obj, codec.HEADER_SIZE + 3))
    cache = DiskCache(CacheConfig(directory=tmp_path / "cache"))

    with pytest.raises(IntegrityError) as info:
        Snapshotter(registry, cache).load("llama:v1")
    message = str(info.value)
    assert "llama:v1" in message and victim.digest in message
    assert victim.digest not in cache  # bad bytes are never cached


@pytest.mark.parametrize("write_content_size", [True, False], ids=["claims", "expands"])
def test_chunk_decompressing_past_its_size_is_rejected(
    tmp_path: Path, write_content_size: bool
) -> None:
    from snapshotter.stores.local import LocalStore

    model = _compressible_model(tmp_path / "zeros")
    registry = Registry(LocalStore(tmp_path / "store"))
    digest = push(registry, model, "zeros:v1")
    victim = _tensor_chunks(registry, digest, "zstd")[0]
    packer = zstandard.ZstdCompressor(write_content_size=write_content_size)
    bomb = codec.HEADER.pack(codec.MAGIC, codec.Codec.ZSTD, victim.size) + packer.compress(
        b"\0" * (victim.size * 4)
    )
    registry.put_chunk(victim.digest, bomb)

    with pytest.raises(ChunkTooLargeError, match="zeros:v1"):
        Snapshotter(registry).load("zeros:v1")
