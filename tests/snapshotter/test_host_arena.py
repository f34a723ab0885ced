"""Prewarmed host memory: a CPU load carves its buffers from it, and gives back the rest."""

from __future__ import annotations

import mmap
from pathlib import Path

import pytest

from snapshotter import DiskCache, Snapshotter
from snapshotter.config import CacheConfig, StoreConfig
from snapshotter.host_arena import ALIGN_BYTES, HostArena
from tests.snapshotter.loadkit import (
    assert_same_tensors,
    counting_registry,
    expected_tensors,
    push,
)


def test_buffers_are_page_aligned_and_the_arena_refuses_what_does_not_fit() -> None:
    arena = HostArena(3 * ALIGN_BYTES)
    first = arena.take(10)
    second = arena.take(ALIGN_BYTES)
    assert first is not None and second is not None
    assert second.data_ptr() - first.data_ptr() == ALIGN_BYTES  # the next page, not byte 10
    assert arena.take(2 * ALIGN_BYTES) is None  # one page is left
    second.fill_(7)
    assert int(second.sum()) == 7 * ALIGN_BYTES


def test_giving_back_the_rest_ends_the_arena_and_keeps_what_was_carved() -> None:
    arena = HostArena(8 * mmap.PAGESIZE)
    kept = arena.take(mmap.PAGESIZE)
    assert kept is not None
    kept.fill_(3)
    assert arena.give_back_rest() == 7 * mmap.PAGESIZE
    assert arena.take(1) is None and arena.free_bytes == 0
    assert int(kept.sum()) == 3 * mmap.PAGESIZE  # carved bytes are untouched
    with pytest.raises(ValueError, match="positive size"):
        HostArena(0)


def _snapshotter(store_config: StoreConfig, tmp_path: Path, llama_dir: Path) -> Snapshotter:
    registry, _ = counting_registry(store_config)
    push(registry, llama_dir, "llama:v1")
    return Snapshotter(registry, DiskCache(CacheConfig(directory=tmp_path / "cache")))


def test_a_load_into_prewarmed_memory_gives_the_same_tensors(
    store_config: StoreConfig, tmp_path: Path, llama_dir: Path
) -> None:
    size = _snapshotter(store_config, tmp_path, llama_dir).load("llama:v1").report.tensor_bytes
    snap = _snapshotter(store_config, tmp_path, llama_dir)
    snap.prewarm("cpu", host_bytes=size + (1 << 20))
    arena = snap._arena
    assert arena is not None
    tensors = snap.load("llama:v1")
    assert_same_tensors(tensors, expected_tensors(llama_dir))
    assert tensors.report.prefaulted_bytes == tensors.report.tensor_bytes
    start = arena._all.data_ptr()
    for t in tensors.values():  # every tensor lies in the prewarmed mapping
        assert start <= t.data_ptr() < start + arena.size
    assert snap.give_back_host_memory() >= (1 << 20) - ALIGN_BYTES
    assert snap.give_back_host_memory() == 0  # once
    assert_same_tensors(tensors, expected_tensors(llama_dir))  # still intact


def test_a_load_larger_than_the_prewarmed_memory_allocates_its_own(
    store_config: StoreConfig, tmp_path: Path, llama_dir: Path
) -> None:
    snap = _snapshotter(store_config, tmp_path, llama_dir)
    snap.prewarm("cpu", host_bytes=ALIGN_BYTES)
    assert snap._arena is not None
    tensors = snap.load("llama:v1")
    assert_same_tensors(tensors, expected_tensors(llama_dir))
    assert tensors.report.prefaulted_bytes == 0 and snap._arena.used_bytes == 0
