"""The CUDA path: pinned staging ring, copy stream, verification on the host. Needs a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from snapshotter import codec
from snapshotter.cache import DiskCache
from snapshotter.config import CacheConfig, LoaderConfig
from snapshotter.errors import IntegrityError
from snapshotter.loader import Snapshotter
from snapshotter.registry import Registry
from snapshotter.stores.local import LocalStore
from tests.snapshotter.loadkit import (
    assert_same_tensors,
    counting_registry,
    entry_payload_at,
    expected_tensors,
    push,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_load_to_cuda_equals_load_file(tmp_path: Path, llama_dir: Path) -> None:
    registry = Registry(LocalStore(tmp_path / "store"))
    push(registry, llama_dir, "llama:v1")
    tensors = Snapshotter(registry).load("llama:v1", "cuda")
    assert all(t.is_cuda for t in tensors.values())
    assert_same_tensors(tensors, expected_tensors(llama_dir))
    shards = len(list(llama_dir.glob("*.safetensors")))
    assert len({t.untyped_storage().data_ptr() for t in tensors.values()}) == shards
    assert tensors.report.place.bytes == tensors.report.tensor_bytes


def test_staging_pool_is_allocated_once_and_reused(tmp_path: Path, llama_dir: Path) -> None:
    from snapshotter.config import StoreConfig

    registry, store = counting_registry(StoreConfig(url=str(tmp_path / "store")))
    push(registry, llama_dir, "llama:v1")
    # Slots smaller than the in-flight cap: the ring must recycle them.
    config = LoaderConfig(chunk_size_bytes=16 << 10, max_inflight_bytes=64 << 10)
    snap = Snapshotter(registry, DiskCache(CacheConfig(tmp_path / "cache")), config)
    snap.prewarm("cuda")
    pool = snap._staging_pool(torch.device("cuda"))
    slots = pool.slots
    first = snap.load("llama:v1", "cuda")
    store.reset()
    second = snap.load("llama:v1", "cuda:0")
    assert snap._staging_pool(torch.device("cuda")) is pool and pool.slots == slots
    assert store.chunk_gets() == []  # cache hits read straight into pinned slots
    assert_same_tensors(first, expected_tensors(llama_dir))
    assert_same_tensors(second, expected_tensors(llama_dir))


def test_chunks_larger_than_a_slot_use_one_off_buffers(tmp_path: Path, llama_dir: Path) -> None:
    registry = Registry(LocalStore(tmp_path / "store"))
    push(registry, llama_dir, "llama:v1")  # 16 KiB chunks
    config = LoaderConfig(chunk_size_bytes=4 << 10, max_inflight_bytes=16 << 10)
    tensors = Snapshotter(registry, config=config).load("llama:v1", "cuda")
    assert_same_tensors(tensors, expected_tensors(llama_dir))


def test_corrupt_chunk_is_caught_on_the_host_before_the_copy(
    tmp_path: Path, llama_dir: Path
) -> None:
    registry = Registry(LocalStore(tmp_path / "store"))
    digest = push(registry, llama_dir, "llama:v1")
    manifest = registry.get_manifest(digest)
    f = manifest.safetensors_files()[0]
    assert f.safetensors is not None
    victim = next(c for c in f.chunks if c.offset >= f.safetensors.data_offset and c.codec == "raw")
    obj = bytearray(registry.get_chunk(victim.digest))
    obj[codec.HEADER_SIZE] ^= 0xFF
    registry.put_chunk(victim.digest, bytes(obj))
    with pytest.raises(IntegrityError, match=victim.digest):
        Snapshotter(registry).load("llama:v1", "cuda")


def test_a_flipped_byte_in_the_disk_cache_is_caught_on_the_host_and_refetched(
    tmp_path: Path, llama_dir: Path
) -> None:
    registry = Registry(LocalStore(tmp_path / "store"))
    digest = push(registry, llama_dir, "llama:v1")
    cache_config = CacheConfig(directory=tmp_path / "cache")
    Snapshotter(registry, DiskCache(cache_config)).load(digest, "cuda")  # fills the cache
    manifest = registry.get_manifest(digest)
    f = manifest.safetensors_files()[0]
    assert f.safetensors is not None
    victim = next(c for c in f.chunks if c.offset >= f.safetensors.data_offset)
    entry = DiskCache(cache_config).path(victim.digest)
    damaged = bytearray(entry.read_bytes())
    damaged[entry_payload_at(entry) + victim.size // 2] ^= 0x10
    entry.write_bytes(bytes(damaged))

    snap = Snapshotter(registry, DiskCache(cache_config))
    tensors = snap.load(digest, "cuda")  # checked by its checksum in the pinned slot
    assert_same_tensors(tensors, expected_tensors(llama_dir))
    counters = snap.source.counters()
    assert (counters.cache_corrupt, counters.store_gets) == (1, 1)


def test_meta_module_fill_on_cuda(tmp_path: Path, llama_dir: Path) -> None:
    from transformers import AutoConfig, LlamaForCausalLM

    registry = Registry(LocalStore(tmp_path / "store"))
    push(registry, llama_dir, "llama:v1")
    with torch.device("meta"):
        model = LlamaForCausalLM(AutoConfig.from_pretrained(llama_dir))
    Snapshotter(registry).load_into_module(model, "llama:v1", "cuda")
    reference = LlamaForCausalLM.from_pretrained(llama_dir)
    torch.nn.Module.to(reference, "cuda")  # (transformers' typed .to() confuses mypy)
    ids = torch.tensor([[1, 5, 9, 200]], device="cuda")
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reference(ids).logits)


@pytest.mark.parametrize("convert", [True, False], ids=["converted-at-push", "as-saved"])
def test_a_mixture_of_experts_checkpoint_is_converted_and_filled_on_cuda(
    tmp_path: Path, convert: bool
) -> None:
    """The experts, stacked at push or apart in the checkpoint (then stacked from the
    tensors the loader put on the device), answer as from_pretrained."""
    from tests.snapshotter.test_module_fill import mixtral

    cls, inputs = mixtral(tmp_path / "model")
    registry = Registry(LocalStore(tmp_path / "store"))
    push(registry, tmp_path / "model", "moe:v1", convert=convert)
    with torch.device("meta"):
        model = cls(cls.config_class.from_pretrained(tmp_path / "model"))
    Snapshotter(registry).load_into_module(model, "moe:v1", "cuda")
    assert model.model.layers[0].mlp.experts.gate_up_proj.is_cuda
    reference = cls.from_pretrained(tmp_path / "model")
    torch.nn.Module.to(reference, "cuda")
    ids = inputs["input_ids"].to("cuda")
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(ids).logits, reference.eval()(ids).logits)
