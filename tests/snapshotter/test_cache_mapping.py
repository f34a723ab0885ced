"""A warm CPU load maps the disk cache's page-cache pages into its buffers, no copy.

The model here is cut so that its chunks start at every offset within a page
(tensors of odd sizes), some stored zstd, some raw, and two files share a
tensor's chunks at different offsets. Every load is compared with the copy
path (``LoaderConfig(map_cache=False)``) and with safetensors' own reading.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from safetensors.torch import save_file

from snapshotter import cache_entry, codec, pages
from snapshotter.cache import DiskCache
from snapshotter.config import CacheConfig, LoaderConfig
from snapshotter.loader import Snapshotter
from snapshotter.manifest import ChunkRef, Manifest
from snapshotter.push import push_directory
from snapshotter.registry import Registry, chunk_key
from snapshotter.stores.local import LocalStore
from tests.snapshotter.loadkit import (
    CountingStore,
    assert_same_tensors,
    entry_payload_at,
    expected_tensors,
)

CHUNK_BYTES = 64 << 10
REF = "mixed:v1"


def _mixed_model(directory: Path) -> Path:
    """Two shards: random (stored raw) and zero (stored zstd) tensors of odd sizes, and
    one tensor in both shards, at offsets that differ within a page."""
    gen = torch.Generator().manual_seed(7)
    shared = torch.randn(30011, generator=gen)
    directory.mkdir()
    save_file(
        {
            "a.head": torch.randn(1001, generator=gen),
            "a.big": torch.randn(50021, generator=gen),
            "a.zeros": torch.zeros(40003),
            "a.shared": shared,
            "a.small": torch.randn(7, 13, generator=gen).to(torch.bfloat16),
        },
        directory / "a.safetensors",
    )
    save_file(
        {
            "b.pad": torch.randn(777, generator=gen),
            "b.shared": shared.clone(),
            "b.mid": torch.randn(33333, generator=gen).to(torch.bfloat16),
            "b.zeros": torch.zeros(3, 20000, dtype=torch.bfloat16),
        },
        directory / "b.safetensors",
    )
    return directory


@pytest.fixture
def pushed(tmp_path: Path) -> tuple[Registry, CountingStore, Path, Manifest]:
    model = _mixed_model(tmp_path / "model")
    store = CountingStore(LocalStore(tmp_path / "store"))
    registry = Registry(store)
    push_directory(model, REF, registry, chunk_size_bytes=CHUNK_BYTES)
    manifest = registry.get_manifest(registry.resolve(REF))
    return registry, store, model, manifest


def _tensor_chunks(manifest: Manifest) -> list[ChunkRef]:
    out = []
    for f in manifest.safetensors_files():
        assert f.safetensors is not None
        out += [c for c in f.chunks if c.offset >= f.safetensors.data_offset]
    return out


def _cache(tmp_path: Path) -> DiskCache:
    return DiskCache(CacheConfig(directory=tmp_path / "cache"))


def _fill(registry: Registry, manifest: Manifest, tmp_path: Path) -> None:
    """A cold load writes every chunk through, raw; then the zstd ones are put back as the
    store holds them, so the cache has both kinds of entry."""
    Snapshotter(registry, _cache(tmp_path)).load(REF)
    cache = _cache(tmp_path)
    for c in _tensor_chunks(manifest):
        if c.codec == "zstd":
            cache.drop(c.digest)
            cache.put(c.digest, registry.get_chunk(c.digest))


def _as_bytes(tensors: dict[str, torch.Tensor]) -> dict[str, bytes]:
    return {k: bytes(t.reshape(-1).view(torch.uint8).numpy()) for k, t in tensors.items()}


def test_the_model_has_what_the_mapped_path_must_handle(
    pushed: tuple[Registry, CountingStore, Path, Manifest],
) -> None:
    _registry, _store, _model, manifest = pushed
    chunks = _tensor_chunks(manifest)
    assert {c.codec for c in chunks} == {"raw", "zstd"}
    in_page = set()
    for f in manifest.safetensors_files():
        assert f.safetensors is not None
        start = f.safetensors.data_offset
        in_page |= {(c.offset - start) % pages.PAGE_BYTES for c in f.chunks if c.offset >= start}
    assert len(in_page) > 3  # chunks start at many offsets within a page
    a, b = ({c.digest for c in f.chunks} for f in manifest.safetensors_files())
    shared = a & b  # the shared tensor's chunks ...
    assert shared
    where = {  # ... at two offsets within a page: mapped in one file, copied in the other
        (c.offset - f.safetensors.data_offset) % pages.PAGE_BYTES
        for f in manifest.safetensors_files()
        if f.safetensors is not None
        for c in f.chunks
        if c.digest in shared
    }
    assert len(where) > 1


def test_a_mapped_warm_load_is_byte_identical_to_the_copy_path(
    pushed: tuple[Registry, CountingStore, Path, Manifest], tmp_path: Path
) -> None:
    registry, store, model, manifest = pushed
    _fill(registry, manifest, tmp_path)
    store.reset()

    mapped = Snapshotter(registry, _cache(tmp_path)).load(REF)
    copied = Snapshotter(registry, _cache(tmp_path), LoaderConfig(map_cache=False)).load(REF)

    assert store.chunk_gets() == []
    assert _as_bytes(mapped) == _as_bytes(copied)
    assert_same_tensors(mapped, expected_tensors(model))
    report = mapped.report
    assert report.cache_hit_bytes == copied.report.cache_hit_bytes
    # Raw entries' whole pages are mapped; zstd entries and the pages at chunk ends are not.
    assert 0 < report.cache_mapped_bytes < report.cache_hit_bytes
    assert copied.report.cache_mapped_bytes == 0


def test_a_corrupt_byte_in_a_mapped_page_is_caught_and_refetched(
    pushed: tuple[Registry, CountingStore, Path, Manifest], tmp_path: Path
) -> None:
    registry, store, model, manifest = pushed
    _fill(registry, manifest, tmp_path)
    victim = max((c for c in _tensor_chunks(manifest) if c.codec == "raw"), key=lambda c: c.size)
    entry = _cache(tmp_path).path(victim.digest)
    at = entry_payload_at(entry) + victim.size // 2  # mid-chunk: inside a whole, mapped page
    data = bytearray(entry.read_bytes())
    data[at] ^= 0x01
    entry.write_bytes(bytes(data))
    store.reset()

    snap = Snapshotter(registry, _cache(tmp_path))
    tensors = snap.load(REF)

    assert_same_tensors(tensors, expected_tensors(model))
    assert store.chunk_gets() == [chunk_key(victim.digest)]
    assert snap.source.counters().cache_corrupt == 1
    assert tensors.report.cache_mapped_bytes > 0
    _header, payload = cache_entry.parse(entry.read_bytes(), victim.size)
    assert bytes(payload) == codec.decode(registry.get_chunk(victim.digest), victim.size)
    again = Snapshotter(registry, _cache(tmp_path)).load(REF)
    assert again.report.cache_mapped_bytes > tensors.report.cache_mapped_bytes  # the new entry


@pytest.mark.parametrize("older", ["THK1", "THC1"])
def test_an_older_entry_still_loads(
    pushed: tuple[Registry, CountingStore, Path, Manifest], tmp_path: Path, older: str
) -> None:
    registry, store, model, manifest = pushed
    _fill(registry, manifest, tmp_path)
    victim = max((c for c in _tensor_chunks(manifest) if c.codec == "raw"), key=lambda c: c.size)
    entry = _cache(tmp_path).path(victim.digest)
    header, payload = cache_entry.parse(entry.read_bytes(), victim.size)
    assert header.checksum is not None
    frame = codec.HEADER.pack(older.encode(), codec.Codec.RAW, victim.size)
    if older == "THK1":  # checksum, then the payload at 32
        frame += cache_entry.EXTENSION.pack(header.checksum, 0)
    entry.write_bytes(frame + bytes(payload))
    store.reset()

    snap = Snapshotter(registry, _cache(tmp_path))
    tensors = snap.load(REF)

    assert_same_tensors(tensors, expected_tensors(model))
    assert store.chunk_gets() == []
    counters = snap.source.counters()
    assert (counters.cache_corrupt, counters.cache_rehashed) == (0, int(older == "THC1"))


def test_writing_a_loaded_tensor_leaves_the_cache_unchanged(
    pushed: tuple[Registry, CountingStore, Path, Manifest], tmp_path: Path
) -> None:
    registry, store, model, manifest = pushed
    _fill(registry, manifest, tmp_path)
    entries = {p: p.read_bytes() for p in (tmp_path / "cache" / "chunks").rglob("*") if p.is_file()}

    tensors = Snapshotter(registry, _cache(tmp_path)).load(REF)
    assert tensors.report.cache_mapped_bytes > 0
    for t in tensors.values():
        t.fill_(3)  # every page of every tensor: each mapped page gets its own copy

    assert all(t.eq(3).all() for t in tensors.values())
    assert {p: p.read_bytes() for p in entries} == entries
    store.reset()
    assert_same_tensors(Snapshotter(registry, _cache(tmp_path)).load(REF), expected_tensors(model))
    assert store.chunk_gets() == []


def test_a_file_that_cannot_be_mapped_leaves_the_buffer_whole(tmp_path: Path) -> None:
    # A pipe, like a filesystem without mmap, refuses: the range is fresh memory again.
    buf = pages.anonymous_buffer(4 * pages.PAGE_BYTES)
    buf.fill_(9)
    read_end, write_end = os.pipe()
    try:
        with pytest.raises(OSError):
            pages.map_file_over(buf.data_ptr() + pages.PAGE_BYTES, pages.PAGE_BYTES, read_end, 0)
    finally:
        os.close(read_end)
        os.close(write_end)
    page = pages.PAGE_BYTES
    assert buf[:page].eq(9).all() and buf[2 * page :].eq(9).all()
    assert buf[page : 2 * page].eq(0).all()  # zeroed, mapped, writable
    buf[page : 2 * page].fill_(1)


@given(
    page_offset=st.integers(0, 4095),
    size=st.integers(1, 5 * 4096),
    kind=st.sampled_from(list(codec.Codec)),
)
def test_a_payload_is_placed_to_map_exactly_when_a_whole_page_can_be(
    page_offset: int, size: int, kind: codec.Codec
) -> None:
    page = 4096
    at = cache_entry.payload_offset(kind, size, page_offset, page)
    first_whole = -page_offset % page  # the chunk's first byte that starts a buffer page
    if kind is codec.Codec.RAW and first_whole + page <= size:
        assert at % page == page_offset
        assert cache_entry.HEADER_SIZE <= at < cache_entry.HEADER_SIZE + page
    else:
        assert at == cache_entry.HEADER_SIZE


@pytest.mark.parametrize("page_offset", [0, 1, 31, 32, 33, 4000, 4095])
def test_a_raw_entry_places_its_payload_at_the_chunks_offset_within_a_page(
    page_offset: int,
) -> None:
    page = 4096
    at = cache_entry.payload_offset(codec.Codec.RAW, 3 * page, page_offset, page)
    assert cache_entry.HEADER_SIZE <= at < cache_entry.HEADER_SIZE + page
    assert at % page == page_offset
    assert cache_entry.payload_offset(codec.Codec.ZSTD, 3 * page, page_offset, page) == 32
    assert cache_entry.payload_offset(codec.Codec.RAW, 3 * page, None, page) == 32
    # No whole page inside the chunk at that offset: nothing to map, no padding.
    assert cache_entry.payload_offset(codec.Codec.RAW, page, page_offset or 1, page) == 32
