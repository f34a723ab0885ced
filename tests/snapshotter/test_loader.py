"""The CPU loader against real pushed artifacts, on a local directory and S3."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from snapshotter import DiskCache, Snapshotter, load, load_into_module
from snapshotter.config import CacheConfig, LoaderConfig, StoreConfig
from snapshotter.pipeline import ByteSemaphore
from snapshotter.registry import Registry
from snapshotter.stores.local import LocalStore
from tests.snapshotter.loadkit import (
    assert_same_tensors,
    counting_registry,
    expected_tensors,
    push,
)


def _cache(tmp_path: Path) -> DiskCache:
    return DiskCache(CacheConfig(directory=tmp_path / "cache"))


def test_model_and_adapters_equal_load_file(
    store_config: StoreConfig, tmp_path: Path, llama_dir: Path, adapter_dirs: list[Path]
) -> None:
    registry, _ = counting_registry(store_config)
    snap = Snapshotter(registry, _cache(tmp_path))
    artifacts = {"llama:v1": llama_dir, "ad0:v1": adapter_dirs[0], "ad1:v1": adapter_dirs[1]}
    for ref, directory in artifacts.items():
        push(registry, directory, ref)
        tensors = snap.load(ref)
        assert_same_tensors(tensors, expected_tensors(directory))
        report = tensors.report
        assert report.tensor_bytes == sum(t.nbytes for t in tensors.values())
        assert report.store_bytes > 0 and report.cache_hit_bytes == 0
        assert report.wall_s > 0 and report.gb_per_s > 0


def test_second_load_makes_no_store_request(
    store_config: StoreConfig, tmp_path: Path, llama_dir: Path
) -> None:
    registry, store = counting_registry(store_config)
    digest = push(registry, llama_dir, "llama:v1")
    snap = Snapshotter(registry, _cache(tmp_path))
    store.reset()
    first = snap.load("llama:v1")
    chunks = {c.digest for f in registry.get_manifest(digest).safetensors_files() for c in f.chunks}
    assert 0 < len(store.chunk_gets()) <= len(chunks)

    store.reset()
    second = Snapshotter(registry, _cache(tmp_path)).load(digest)  # a fresh process, same disk
    assert store.gets == []  # no chunk, manifest or profile read
    third = Snapshotter(registry, _cache(tmp_path)).load("llama:v1")
    assert store.gets == ["tags/llama/v1"]  # a tag can move, so it is always read
    assert third.report.store_gets == 0
    assert second.report.store_bytes == 0
    assert second.report.cache_hits == first.report.store_gets
    assert second.report.cache_hit_bytes == second.report.verify_decompress.bytes
    assert_same_tensors(second, expected_tensors(llama_dir))


def test_fill_meta_module_gives_the_same_logits(tmp_path: Path, llama_dir: Path) -> None:
    from transformers import AutoConfig, LlamaForCausalLM

    registry = Registry(LocalStore(tmp_path / "store"))
    push(registry, llama_dir, "llama:v1")
    with torch.device("meta"):
        model = LlamaForCausalLM(AutoConfig.from_pretrained(llama_dir))
    result = load_into_module(model, "llama:v1", registry=registry)
    assert result.missing_keys == () and result.unexpected_keys == ()
    assert any(name.endswith("rotary_emb.inv_freq") for name in result.recomputed_buffers)
    assert not any(t.is_meta for t in [*model.parameters(), *model.buffers()])

    reference = LlamaForCausalLM.from_pretrained(llama_dir)
    ids = torch.tensor([[1, 5, 9, 200, 3, 17]])
    with torch.no_grad():
        assert torch.equal(model.eval()(ids).logits, reference.eval()(ids).logits)


def test_fill_ties_weights_the_checkpoint_omits(tmp_path: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    torch.manual_seed(3)
    LlamaForCausalLM(config).save_pretrained(tmp_path / "tied")
    assert "lm_head.weight" not in expected_tensors(tmp_path / "tied")
    registry = Registry(LocalStore(tmp_path / "store"))
    push(registry, tmp_path / "tied", "tied:v1")
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    load_into_module(model, "tied:v1", registry=registry)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    reference = LlamaForCausalLM.from_pretrained(tmp_path / "tied")
    ids = torch.tensor([[1, 2, 3, 60]])
    with torch.no_grad():
        assert torch.equal(model.eval()(ids).logits, reference.eval()(ids).logits)


def test_read_file_returns_verified_bytes_through_the_cache(
    tmp_path: Path, llama_dir: Path
) -> None:
    registry, store = counting_registry(StoreConfig(url=str(tmp_path / "store")))
    push(registry, llama_dir, "llama:v1")
    snap = Snapshotter(registry, _cache(tmp_path))
    assert snap.read_file("llama:v1", "config.json") == (llama_dir / "config.json").read_bytes()
    store.reset()
    assert snap.read_file("llama:v1", "config.json") == (llama_dir / "config.json").read_bytes()
    assert store.chunk_gets() == []
    with pytest.raises(KeyError, match=r"no file 'nope\.json'"):
        snap.read_file("llama:v1", "nope.json")


def test_in_flight_bytes_stay_under_the_cap(tmp_path: Path, llama_dir: Path) -> None:
    registry = Registry(LocalStore(tmp_path / "store"))
    push(registry, llama_dir, "llama:v1")
    cap_bytes = 40 << 10  # a little over two 16 KiB chunks
    tight = load("llama:v1", registry=registry, config=LoaderConfig(max_inflight_bytes=cap_bytes))
    assert 0 < tight.report.peak_inflight_bytes <= cap_bytes
    loose = load("llama:v1", registry=registry, config=LoaderConfig(max_inflight_bytes=1 << 30))
    # The instrument measures something: unbounded, more is in flight at once.
    assert loose.report.peak_inflight_bytes > cap_bytes
    assert_same_tensors(tight, expected_tensors(llama_dir))


def test_byte_semaphore_bounds_concurrent_holders() -> None:
    import threading

    sem = ByteSemaphore(100)
    held, peak, lock = [0], [0], threading.Lock()

    def worker(n: int) -> None:
        for _ in range(50):
            assert sem.acquire(n, lambda: False)
            with lock:
                held[0] += n
                peak[0] = max(peak[0], held[0])
            with lock:
                held[0] -= n
            sem.release(n)

    threads = [threading.Thread(target=worker, args=(n,)) for n in (30, 40, 60, 70)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak[0] <= 100 and sem.peak_bytes <= 100 and sem.inflight_bytes == 0
    assert sem.weight(10**9) == 100  # an oversized chunk passes alone
    assert not sem.acquire(101, lambda: True)


def _write_misaligned(path: Path) -> dict[str, torch.Tensor]:
    """A safetensors file whose F32 tensor starts at an odd offset (legal in the format)."""
    small = torch.tensor([1, 2, 3], dtype=torch.int8)
    wide = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    header = {
        "small": {"dtype": "I8", "shape": [3], "data_offsets": [0, 3]},
        "wide": {"dtype": "F32", "shape": [2, 3], "data_offsets": [3, 27]},
    }
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    data = small.numpy().tobytes() + wide.numpy().tobytes()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + data)
    return {"small": small, "wide": wide}


def test_every_dtype_and_a_misaligned_tensor(tmp_path: Path) -> None:
    model = tmp_path / "dtypes"
    model.mkdir()
    dtypes = [
        torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
        torch.float16, torch.bfloat16, torch.float32, torch.float64,
        torch.float8_e4m3fn, torch.float8_e5m2, torch.uint16, torch.uint32, torch.uint64,
    ]  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    tensors = {
        f"t{i}": torch.randint(0, 2 if dt is torch.bool else 100, (3, 5), generator=gen).to(dt)
        for i, dt in enumerate(dtypes)
    }
    tensors["scalar"] = torch.tensor(3.5)
    tensors["empty"] = torch.zeros(0, 4)
    save_file(tensors, model / "model.safetensors")
    registry = Registry(LocalStore(tmp_path / "store"))
    push(registry, model, "dtypes:v1")
    got = load("dtypes:v1", registry=registry)
    assert_same_tensors(got, load_file(model / "model.safetensors"))

    odd = tmp_path / "odd"
    odd.mkdir()
    want = _write_misaligned(odd / "model.safetensors")
    push(registry, odd, "odd:v1")
    assert_same_tensors(load("odd:v1", registry=registry), want)


def test_tensors_are_views_of_one_buffer_per_file(tmp_path: Path, llama_dir: Path) -> None:
    registry = Registry(LocalStore(tmp_path / "store"))
    push(registry, llama_dir, "llama:v1")
    tensors = load("llama:v1", registry=registry)
    storages = {t.untyped_storage().data_ptr() for t in tensors.values()}
    shards = len(list(llama_dir.glob("*.safetensors")))
    assert len(storages) == shards


def test_unknown_device_is_refused(tmp_path: Path, llama_dir: Path) -> None:
    registry = Registry(LocalStore(tmp_path / "store"))
    push(registry, llama_dir, "llama:v1")
    with pytest.raises(ValueError, match="cannot load to device"):
        load("llama:v1", "meta", registry=registry)
    with pytest.raises(TypeError, match="registry="):
        load("llama:v1")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_cuda_without_a_gpu_says_so(tmp_path: Path) -> None:
    snap = Snapshotter(Registry(LocalStore(tmp_path / "store")))
    with pytest.raises(ValueError, match="no CUDA device"):
        snap.load("llama:v1", "cuda")
    with pytest.raises(ValueError, match="no CUDA device"):
        snap.prewarm("cuda:0")


def test_public_surface_is_pinned_and_light() -> None:
    import subprocess
    import sys

    import snapshotter

    assert set(snapshotter.__all__) >= {
        "CacheInventory",
        "ChunkSource",
        "DiskCache",
        "LoadReport",
        "LoadedTensors",
        "ModuleAccessRecorder",
        "ModuleLoadResult",
        "RamTier",
        "RamTierInventory",
        "Snapshotter",
        "load",
        "load_into_module",
        "record_access",
    }
    for name in snapshotter.__all__:
        assert getattr(snapshotter, name) is not None
    probe = "import sys, snapshotter; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"  # importing the package does not import torch
