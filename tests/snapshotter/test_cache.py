"""Disk chunk cache: the pure eviction choice, then the real directory."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from snapshotter import cache as cache_mod
from snapshotter import cache_entry, codec
from snapshotter.cache import CacheEntry, DiskCache, choose_victims
from snapshotter.config import CacheConfig
from snapshotter.digest import checksum_bytes, digest_bytes
from snapshotter.errors import CacheFullError, IntegrityError
from snapshotter.manifest import ArtifactKind, ChunkRef, FileEntry, Manifest


def _d(i: int) -> str:
    return "blake3:" + f"{i:064x}"


# --- choose_victims: no I/O -------------------------------------------------------


def test_nothing_evicted_when_it_fits() -> None:
    entries = {_d(1): CacheEntry(40, 1), _d(2): CacheEntry(40, 2)}
    assert choose_victims(entries, cap_bytes=100, incoming_bytes=20) == []


def test_least_recently_used_go_first_and_only_as_many_as_needed() -> None:
    entries = {_d(1): CacheEntry(40, 30), _d(2): CacheEntry(40, 10), _d(3): CacheEntry(40, 20)}
    assert choose_victims(entries, cap_bytes=120, incoming_bytes=10) == [_d(2)]
    assert choose_victims(entries, cap_bytes=120, incoming_bytes=60) == [_d(2), _d(3)]


def test_protected_entries_are_skipped() -> None:
    entries = {_d(1): CacheEntry(40, 1), _d(2): CacheEntry(40, 2)}
    assert choose_victims(entries, 80, 10, protected=[_d(1)]) == [_d(2)]


def test_incoming_larger_than_cap_is_refused() -> None:
    with pytest.raises(CacheFullError, match="THAW_CACHE_MAX_BYTES"):
        choose_victims({_d(1): CacheEntry(10, 1)}, cap_bytes=100, incoming_bytes=101)


@given(
    sizes=st.lists(st.tuples(st.integers(1, 50), st.integers(0, 1000)), max_size=30),
    cap=st.integers(1, 800),
    incoming=st.integers(0, 100),
)
def test_victims_are_the_oldest_prefix_that_makes_room(
    sizes: list[tuple[int, int]], cap: int, incoming: int
) -> None:
    entries = {_d(i): CacheEntry(size, used) for i, (size, used) in enumerate(sizes)}
    total = sum(e.size_bytes for e in entries.values())
    try:
        victims = choose_victims(entries, cap, incoming)
    except CacheFullError:
        assert incoming > cap
        return
    freed = sum(entries[v].size_bytes for v in victims)
    assert total - freed + incoming <= cap
    by_age = sorted(entries, key=lambda d: (entries[d].last_used_ns, d))
    assert victims == by_age[: len(victims)]
    if victims:  # minimal: without the last victim it would not fit
        assert total - freed + entries[victims[-1]].size_bytes + incoming > cap


# --- the real directory -----------------------------------------------------------


def _chunk(raw: bytes) -> tuple[ChunkRef, bytes]:
    framed, kind = codec.encode(raw)
    return ChunkRef(digest_bytes(raw), 0, len(raw), len(framed), kind.label), framed


def _cache(tmp_path: Path, max_bytes: int = 1 << 20) -> DiskCache:
    return DiskCache(CacheConfig(directory=tmp_path / "cache", max_bytes=max_bytes))


def _entry_bytes(framed: bytes) -> int:
    """An entry's size: the store's object plus the header's checksum extension."""
    return len(framed) + cache_entry.EXTENSION.size


@pytest.mark.parametrize("raw", [os.urandom(5000), b"\0" * 5000], ids=["raw", "zstd"])
def test_put_then_read_into_round_trips_with_the_checksum_recorded(
    tmp_path: Path, raw: bytes
) -> None:
    cache = _cache(tmp_path)
    ref, framed = _chunk(raw)
    cache.put(ref.digest, framed)
    dest = bytearray(ref.size)
    hit = cache.read_into(ref, memoryview(dest))
    assert hit is not None and hit.checksum == checksum_bytes(raw)
    assert bytes(dest) == raw
    # The store's codec and payload, behind a header that also records the checksum.
    kind, payload = codec.read_header(framed, ref.size)
    header = cache_entry.pack_header(kind, ref.size, checksum_bytes(raw))
    assert cache.path(ref.digest).read_bytes() == header + bytes(payload)


def test_put_raw_frames_raw_and_reads_back(tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    raw = b"\0" * 5000  # compressible, but kept raw in the cache
    ref, _ = _chunk(raw)
    cache.put_raw(ref.digest, memoryview(raw))
    header = cache_entry.pack_header(codec.Codec.RAW, len(raw), checksum_bytes(raw))
    assert cache.path(ref.digest).read_bytes() == header + raw
    dest = bytearray(ref.size)
    hit = cache.read_into(ref, memoryview(dest))
    assert hit is not None and hit.checksum == checksum_bytes(raw)
    assert bytes(dest) == raw
    assert cache.total_bytes == cache_entry.HEADER_SIZE + len(raw)


def test_miss_returns_none(tmp_path: Path) -> None:
    ref, _ = _chunk(b"abc")
    assert _cache(tmp_path).read_into(ref, memoryview(bytearray(3))) is None


@pytest.mark.parametrize(
    "keep_bytes", [-1, cache_entry.HEADER_SIZE - 1], ids=["in the payload", "in the header"]
)
def test_truncated_entry_is_an_integrity_error(tmp_path: Path, keep_bytes: int) -> None:
    cache = _cache(tmp_path)
    ref, framed = _chunk(os.urandom(100))
    cache.put(ref.digest, framed)
    entry = cache.path(ref.digest)
    entry.write_bytes(entry.read_bytes()[:keep_bytes])
    with pytest.raises(IntegrityError, match="truncated"):
        cache.read_into(ref, memoryview(bytearray(ref.size)))


def test_an_older_entry_records_no_checksum_until_record_writes_one(tmp_path: Path) -> None:
    raw = os.urandom(3000)
    ref, framed = _chunk(raw)
    older = _cache(tmp_path).path(ref.digest)
    older.parent.mkdir(parents=True)
    older.write_bytes(framed)  # what an older thaw wrote: the store's object as is
    cache = _cache(tmp_path)
    dest = bytearray(ref.size)
    hit = cache.read_into(ref, memoryview(dest))
    assert hit is not None and hit.checksum is None and bytes(dest) == raw

    cache.record(ref.digest, memoryview(dest))
    hit = cache.read_into(ref, memoryview(bytearray(ref.size)))
    assert hit is not None and hit.checksum == checksum_bytes(raw)
    assert cache.total_bytes == _entry_bytes(framed) == older.stat().st_size
    assert _cache(tmp_path).total_bytes == cache.total_bytes  # as a restart indexes it


def test_a_record_that_cannot_be_written_keeps_the_older_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = os.urandom(3000)
    ref, framed = _chunk(raw)
    older = _cache(tmp_path).path(ref.digest)
    older.parent.mkdir(parents=True)
    older.write_bytes(framed)
    cache = _cache(tmp_path)

    def no_space(fd: int, data: memoryview) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cache_mod, "_write_all", no_space)
    with pytest.raises(CacheFullError):
        cache.record(ref.digest, memoryview(raw))
    assert ref.digest in cache and cache.total_bytes == len(framed)
    assert older.read_bytes() == framed


def test_eviction_keeps_recently_used_and_respects_cap(tmp_path: Path) -> None:
    chunks = [_chunk(os.urandom(1000)) for _ in range(4)]
    entry_bytes = _entry_bytes(chunks[0][1])
    cache = _cache(tmp_path, max_bytes=3 * entry_bytes)
    for ref, framed in chunks[:3]:
        cache.put(ref.digest, framed)
    # Touch the oldest, so the second becomes the LRU victim.
    assert cache.read_into(chunks[0][0], memoryview(bytearray(1000)))
    cache.put(chunks[3][0].digest, chunks[3][1])
    assert chunks[1][0].digest not in cache
    assert not cache.path(chunks[1][0].digest).exists()
    assert {c[0].digest for c in (chunks[0], chunks[2], chunks[3])} <= set(cache.entries())
    assert cache.total_bytes == 3 * entry_bytes <= cache.config.max_bytes


def test_lru_order_survives_a_restart(tmp_path: Path) -> None:
    chunks = [_chunk(os.urandom(1000)) for _ in range(3)]
    cache = _cache(tmp_path)
    for ref, framed in chunks:
        cache.put(ref.digest, framed)
    # Make the file times unambiguous, then use the first again.
    for i, (ref, _) in enumerate(chunks):
        os.utime(cache.path(ref.digest), ns=(10**18 + i, 10**18 + i))
    cache.read_into(chunks[0][0], memoryview(bytearray(1000)))

    reopened = _cache(tmp_path, max_bytes=3 * _entry_bytes(chunks[0][1]))
    assert reopened.inventory().digests == {c[0].digest for c in chunks}
    new_ref, new_framed = _chunk(os.urandom(1000))
    reopened.put(new_ref.digest, new_framed)
    assert chunks[1][0].digest not in reopened  # the least recently used before restart
    assert chunks[0][0].digest in reopened


def test_enospc_raises_cache_full_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = _cache(tmp_path)
    ref, framed = _chunk(os.urandom(4000))

    def write_half_then_fail(fd: int, data: memoryview) -> None:
        os.write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cache_mod, "_write_all", write_half_then_fail)
    with pytest.raises(CacheFullError, match="full"):
        cache.put(ref.digest, framed)
    leftovers = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert leftovers == []
    assert ref.digest not in cache
    assert cache.total_bytes == 0


def test_inventory_and_contains_bytes(tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    (a, fa), (b, _fb) = _chunk(os.urandom(300)), _chunk(os.urandom(700))
    cache.put(a.digest, fa)
    b_at = ChunkRef(b.digest, 300, b.size, b.stored_size, b.codec)
    manifest = Manifest(
        kind=ArtifactKind.MODEL,
        files=(FileEntry("w.bin", 1000, _d(9), (a, b_at)),),
    )
    assert cache.contains_bytes(manifest) == 300
    inv = cache.inventory()
    assert inv.digests == {a.digest}
    assert inv.total_bytes == _entry_bytes(fa)
    assert inv.max_bytes == 1 << 20


def test_drop_removes_the_entry(tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    ref, framed = _chunk(os.urandom(10))
    cache.put(ref.digest, framed)
    cache.drop(ref.digest)
    assert ref.digest not in cache
    assert not cache.path(ref.digest).exists()
    assert cache.total_bytes == 0


def test_manifests_are_kept_and_checked_against_their_digest(tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    data = b'{"schema":"thaw.manifest/v1"}'
    digest = digest_bytes(data)
    assert cache.get_manifest(digest) is None
    cache.put_manifest(digest, data)
    assert cache.get_manifest(digest) == data
    (tmp_path / "cache" / "manifests" / digest.split(":")[1]).write_bytes(data + b" ")
    assert cache.get_manifest(digest) is None  # tampered: ignored and removed
    assert not (tmp_path / "cache" / "manifests" / digest.split(":")[1]).exists()
