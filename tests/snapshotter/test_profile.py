"""Prefetch profiles: the pure chunk order, recording, and a load that follows it."""

from __future__ import annotations

from pathlib import Path

import torch
from hypothesis import given
from hypothesis import strategies as st

from snapshotter.config import LoaderConfig, StoreConfig
from snapshotter.loader import Snapshotter
from snapshotter.manifest import (
    ArtifactKind,
    ChunkRef,
    FileEntry,
    Manifest,
    SafetensorsInfo,
    TensorInfo,
)
from snapshotter.profile import ModuleAccessRecorder, order_chunks, record_access
from snapshotter.registry import chunk_key
from tests.snapshotter.loadkit import counting_registry, push


def _d(i: int) -> str:
    return "blake3:" + f"{i:064x}"


def _manifest() -> Manifest:
    """Two files; file 0: header chunk + tensors a (2 chunks), b; file 1: header + c."""
    tensors0 = (TensorInfo("a", "F32", (8,), 0, 32), TensorInfo("b", "F32", (4,), 32, 48))
    chunks0 = (
        ChunkRef(_d(0), 0, 100, 116, "raw"),
        ChunkRef(_d(1), 100, 16, 32, "raw"),
        ChunkRef(_d(2), 116, 16, 32, "raw"),
        ChunkRef(_d(3), 132, 16, 32, "raw"),
    )
    f0 = FileEntry(
        "m0.safetensors", 148, _d(9), chunks0, safetensors=SafetensorsInfo(100, tensors0)
    )
    chunks1 = (ChunkRef(_d(4), 0, 50, 66, "raw"), ChunkRef(_d(5), 50, 8, 24, "raw"))
    tensors1 = (TensorInfo("c", "F32", (2,), 0, 8),)
    f1 = FileEntry("m1.safetensors", 58, _d(8), chunks1, safetensors=SafetensorsInfo(50, tensors1))
    return Manifest(kind=ArtifactKind.MODEL, files=(f0, f1))


def test_default_order_is_file_order() -> None:
    assert order_chunks(_manifest(), None) == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1)]


def test_profiled_names_come_first_in_their_order() -> None:
    order = order_chunks(_manifest(), ["c", "b", "nonexistent", "a"])
    assert order[:4] == [(1, 1), (0, 3), (0, 1), (0, 2)]
    assert order[4:] == [(0, 0), (1, 0)]


def test_a_file_path_names_all_its_chunks() -> None:
    assert order_chunks(_manifest(), ["m1.safetensors"])[:2] == [(1, 0), (1, 1)]


@given(st.lists(st.sampled_from(["a", "b", "c", "m0.safetensors", "zzz"]), max_size=8))
def test_every_chunk_exactly_once(names: list[str]) -> None:
    order = order_chunks(_manifest(), names)
    assert sorted(order) == sorted(set(order)) == order_chunks(_manifest(), None)


def test_recorded_order_drives_the_next_load(
    store_config: StoreConfig, tmp_path: Path, llama_dir: Path
) -> None:
    registry, store = counting_registry(store_config)
    digest = push(registry, llama_dir, "llama:v1")
    # One fetch thread, so store gets happen in submission order.
    snap = Snapshotter(registry, config=LoaderConfig(fetch_threads=1))

    store.reset()
    tensors = snap.load("llama:v1")
    default_gets = store.chunk_gets()
    recorder = record_access(tensors)
    wanted = ["lm_head.weight", "model.layers.1.mlp.down_proj.weight", "model.norm.weight"]
    for name in wanted:
        recorder[name]
    recorder["lm_head.weight"]  # a second touch does not move it
    assert recorder.save_profile(registry) == wanted
    assert registry.get_profile(digest) == wanted

    store.reset()
    snap.load("llama:v1")
    profiled_gets = store.chunk_gets()
    manifest = registry.get_manifest(digest)
    expected_first: list[str] = []
    for name in wanted:
        f = next(f for f in manifest.safetensors_files() if f.safetensors and name in _names(f))
        assert f.safetensors is not None
        t = f.safetensors.tensor(name)
        lo, hi = f.safetensors.data_offset + t.begin, f.safetensors.data_offset + t.end
        for c in f.chunks:
            key = chunk_key(c.digest)
            if c.offset < hi and c.end > lo and key not in expected_first:
                expected_first.append(key)
    assert profiled_gets[: len(expected_first)] == expected_first
    assert sorted(profiled_gets) == sorted(default_gets)
    assert profiled_gets != default_gets


def _names(f: FileEntry) -> set[str]:
    assert f.safetensors is not None
    return {t.name for t in f.safetensors.tensors}


def test_module_recorder_notes_first_forward_order(tmp_path: Path, llama_dir: Path) -> None:
    from transformers import AutoConfig, LlamaForCausalLM

    from snapshotter.registry import Registry
    from snapshotter.stores.local import LocalStore

    registry = Registry(LocalStore(tmp_path / "store"))
    digest = push(registry, llama_dir, "llama:v1")
    with torch.device("meta"):
        model = LlamaForCausalLM(AutoConfig.from_pretrained(llama_dir))
    Snapshotter(registry).load_into_module(model, "llama:v1")
    with ModuleAccessRecorder(model) as recorder, torch.no_grad():
        model(torch.tensor([[1, 2, 3]]))
    order = recorder.save_profile(registry, digest)
    assert order[0] == "model.embed_tokens.weight"
    assert order.index("model.layers.0.self_attn.q_proj.weight") < order.index(
        "model.layers.1.self_attn.q_proj.weight"
    )
    assert order.index("model.norm.weight") < order.index("lm_head.weight")
    assert registry.get_profile(digest) == order
    # Hooks are gone after the block: another forward records nothing new.
    model(torch.tensor([[4]]))
    assert recorder.order == order
