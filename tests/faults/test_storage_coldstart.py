"""Item 11 through real worker cold starts: a flipped byte in the worker's disk cache is
refetched before use; a flipped byte in the store fails the start, naming the chunk.

A control plane and a ``thaw worker`` run as processes on their own store (the shared
e2e store is not touched). The RAM tier is off, so every start reads the disk cache.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from snapshotter import cache_entry
from snapshotter.digest import digest_bytes
from snapshotter.manifest import ArtifactKind, ChunkRef
from snapshotter.push import push_directory
from snapshotter.registry import Registry
from snapshotter.stores import LocalStore
from tests.e2e.conftest import FUNCTIONS, E2EStore
from tests.faults.conftest import FaultStack, fault_stack

MODEL = "llama-tiny:v1"


@pytest.fixture(scope="module")
def own_store(tmp_path_factory: pytest.TempPathFactory, llama_dir: Path) -> E2EStore:
    root = tmp_path_factory.mktemp("storage-coldstart") / "store"
    registry = Registry(LocalStore(root))
    push_directory(llama_dir, MODEL, registry, chunk_size_bytes=16 << 10)
    bundle = push_directory(FUNCTIONS, "bundles/e2e:v1", registry, kind=ArtifactKind.BUNDLE)
    return E2EStore(root=root, bundle=bundle.digest)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, own_store: E2EStore) -> Iterator[FaultStack]:
    tmp = tmp_path_factory.mktemp("storage-coldstart-stack")
    with fault_stack("embedded", tmp, own_store, THAW_RAM_TIER_MAX_BYTES="0") as s:
        yield s


def _deploy_and_call(stack: FaultStack, store: E2EStore, name: str) -> Any:
    stack.deploy(
        {
            "name": name,
            "bundle": store.bundle,
            "entry": "app:Probe",
            "model": MODEL,
            "device": "cpu",
            "timeout_s": 60,
            "retries": 0,
            "scaling": {"min_replicas": 0, "max_replicas": 1, "idle_timeout_s": 300},
        }
    )
    with stack.client() as c:
        return c.post(f"/v1/functions/{name}/invoke", json={"input": {"n": 1}})


def _tensor_chunk(registry: Registry) -> ChunkRef:
    manifest = registry.get_manifest(registry.resolve(MODEL))
    f = manifest.safetensors_files()[0]
    assert f.safetensors is not None
    return next(c for c in f.chunks if c.offset >= f.safetensors.data_offset)


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-2] ^= 0x10
    path.write_bytes(bytes(data))


@pytest.mark.slow
def test_flipped_byte_in_cache_then_in_store_through_worker_cold_starts(
    stack: FaultStack, own_store: E2EStore
) -> None:
    registry = Registry(LocalStore(own_store.root))
    first = _deploy_and_call(stack, own_store, "cold-a")  # fills the worker's disk cache
    assert first.status_code == 200, first.text
    tensors = first.json()["output"]["tensors"]
    victim = _tensor_chunk(registry)
    h = victim.digest.split(":", 1)[1]
    [entry] = list((stack.root / "home" / "cache" / "chunks").glob(f"*/{h}"))
    _flip(entry)

    healed = _deploy_and_call(stack, own_store, "cold-b")  # a new replica: a cold start
    assert healed.status_code == 200, healed.text
    assert healed.json()["output"]["tensors"] == tensors
    raw = cache_entry.decode(entry.read_bytes(), victim.size)
    assert digest_bytes(raw) == victim.digest  # the worker replaced the entry from the store

    entry.unlink()  # the next start must read this chunk from the store, which is now bad
    stored = own_store.root / "chunks" / h[:2] / h
    _flip(stored)
    failed = _deploy_and_call(stack, own_store, "cold-c")
    assert failed.status_code == 500, failed.text
    call = failed.json()
    assert call["status"] == "failed" and call["output"] is None
    assert f"chunk {victim.digest}" in call["error"] and "corrupt" in call["error"]
