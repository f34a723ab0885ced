"""A replica on CUDA: device context made in the generic start, weights streamed onto the GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from snapshotter.config import StoreConfig
from snapshotter.manifest import ArtifactKind
from snapshotter.push import push_directory
from snapshotter.registry import Registry
from snapshotter.stores import open_store
from tests.worker.test_pool import model_spec
from tests.worker.test_specialize import FUNCTIONS, store_spec
from worker.child_protocol import AdapterRef, ReplicaSpec
from worker.pool import ProcessPool
from worker.runtimes.base import CallRequest
from worker.runtimes.process import ProcessRuntime
from worker.zygote import ForkedProcess

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_cuda_replica_gets_weights_and_adapters_on_the_gpu(
    tmp_path: Path, llama_dir: Path, adapter_dirs: list[Path]
) -> None:
    config = StoreConfig(url=str(tmp_path / "store"))
    registry = Registry(open_store(config))
    model = push_directory(llama_dir, "llama:v1", registry)
    adapter = push_directory(adapter_dirs[0], "ad:v1", registry)
    bundle = push_directory(
        FUNCTIONS / "inspect_model", "fn/inspect:v1", registry, kind=ArtifactKind.BUNDLE
    )
    spec = ReplicaSpec(
        replica_id="r1",
        function="inspect",
        bundle_digest=bundle.digest,
        entry="app:Inspect",
        model_digest=model.digest,
        adapters=[AdapterRef(name="a0", digest=adapter.digest)],
        device="cuda",
        store=store_spec(config, tmp_path),
    )
    runtime = ProcessRuntime()
    replica = runtime.start(spec, lambda *_: None)
    try:
        [done] = list(replica.call(CallRequest("c1", input="report")))
    finally:
        replica.stop()
        runtime.close()
    assert done.kind == "succeeded", done.error
    devices = {device for device, _shape in done.output["weights"].values()}
    assert devices == {"cuda:0"}
    assert replica.phases_ms["device_init"] > 0.0


def llama_spec(tmp_path: Path, llama_dir: Path) -> ReplicaSpec:
    """A replica of the LoRA test function over ``llama_dir``, pushed to a local store."""
    registry = Registry(open_store(StoreConfig(url=str(tmp_path / "store"))))
    model = push_directory(llama_dir, "llama:v1", registry).digest
    return model_spec("r0", tmp_path / "store", model, tmp_path)


def test_a_pooled_cuda_process_starts_warm_and_a_restart_maps_the_ram_tier(
    tmp_path: Path, llama_dir: Path
) -> None:
    spec = llama_spec(tmp_path, llama_dir)
    pool = ProcessPool(warm_size=1, store=spec.store, preload=("transformers", "peft"))
    runtime = ProcessRuntime(pool)
    loads = []
    try:
        for i in range(2):
            runtime.prewarm_device("cuda")  # the loader and its pinned staging, before the start
            cuda_spec = spec.model_copy(update={"replica_id": f"r{i}", "device": "cuda"})
            replica = runtime.start(cuda_spec, lambda *_: None)
            [done] = list(replica.call(CallRequest("c", {"ids": [1, 2, 3]})))
            replica.stop()
            assert done.kind == "succeeded", done.error
            assert replica.phases_ms["process_start"] == replica.phases_ms["device_init"] == 0.0
            [load] = replica.loads
            loads.append(load)
    finally:
        runtime.close()
    first, second = loads
    assert first.store_gets > 0 and first.ram_bytes == 0
    assert second.ram_bytes == second.tensor_bytes and second.store_gets == 0


def test_a_cuda_pool_miss_is_a_fork_of_the_zygote_with_its_own_context(
    tmp_path: Path, llama_dir: Path
) -> None:
    spec = llama_spec(tmp_path, llama_dir)
    pool = ProcessPool(warm_size=0, zygote=True, preload=("transformers", "peft"))
    pool.start_zygote()
    runtime = ProcessRuntime(pool)
    try:
        assert pool._zygote is not None and pool._zygote.forks_cuda
        zygote_imports_ms = pool._zygote.imports_ms
        cuda_spec = spec.model_copy(update={"device": "cuda"})
        replicas = [
            runtime.start(cuda_spec.model_copy(update={"replica_id": f"r{i}"}), lambda *_: None)
            for i in range(2)
        ]
        done = [list(r.call(CallRequest("c", {"ids": [1, 2, 3]}))) for r in replicas]
        for replica in replicas:
            replica.stop()
    finally:
        runtime.close()
    for replica, [result] in zip(replicas, done, strict=True):
        assert result.kind == "succeeded", result.error
        assert isinstance(replica.process.proc, ForkedProcess)
        assert replica.phases_ms["device_init"] > 0.0  # its own context, made after the fork
        assert replica.phases_ms["imports"] < zygote_imports_ms
    first, second = (torch.tensor(result.output["logits"]) for [result] in done)
    torch.testing.assert_close(first, second)  # the same weights, on two contexts
    assert done[0][0].output["preloaded"] == ["peft", "torch", "transformers"]  # from the zygote
