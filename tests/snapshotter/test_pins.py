"""Pins keep what deployed functions use from ``thaw gc``, even after its tag moved."""

from __future__ import annotations

from pathlib import Path

from snapshotter import pins
from snapshotter.gc import plan_gc, sweep
from snapshotter.registry import Registry
from snapshotter.stores.local import LocalStore
from tests.snapshotter.loadkit import push


def _gc(registry: Registry) -> None:
    plan, roots, live = plan_gc(registry, grace_s=0.0)
    sweep(registry, plan, roots, live)


def _chunk_keys(registry: Registry) -> set[str]:
    return set(registry.store.list("chunks/"))


def test_a_pinned_model_survives_gc_after_its_tag_moved_and_goes_once_unpinned(
    tmp_path: Path, llama_dir: Path
) -> None:
    registry = Registry(LocalStore(tmp_path / "store"))
    digest = push(registry, llama_dir, "llama:v1")
    chunks = _chunk_keys(registry)
    pins.pin(registry.store, pins.function_owner("chat", 1), [digest])
    registry.delete_tag("llama:v1")  # the tag moved on; version 1 of "chat" still runs it

    _gc(registry)
    assert registry.get_manifest(digest).kind.value == "model"
    assert _chunk_keys(registry) == chunks

    pins.unpin(registry.store, pins.function_owner("chat"))
    _gc(registry)
    assert _chunk_keys(registry) == set()
    assert list(registry.manifest_digests()) == []


def test_unpinning_a_function_leaves_other_functions_pins(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    a, ab = "blake3:" + "a" * 64, "blake3:" + "b" * 64
    pins.pin(store, pins.function_owner("a", 1), [a])
    pins.pin(store, pins.function_owner("ab", 1), [ab])
    pins.unpin(store, pins.function_owner("a"))
    assert [store.get(k).decode() for k in store.list(pins.PREFIX)] == [ab]
