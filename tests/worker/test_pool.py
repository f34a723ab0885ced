"""Generic processes: the pool hands out warm ones and refills; a bad start is explained."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from snapshotter import DiskCache, Snapshotter
from snapshotter.config import CacheConfig, StoreConfig
from snapshotter.push import push_directory
from snapshotter.registry import Registry
from snapshotter.stores import LocalStore, open_store
from worker.child_protocol import ReplicaSpec, StoreSpec
from worker.pool import ProcessPool, SpawnError, spawn_generic
from worker.runtimes.base import CallRequest
from worker.runtimes.process import ProcessRuntime

FUNCTIONS = Path(__file__).parent / "functions"


def test_warm_process_skips_generic_phases_and_the_pool_refills() -> None:
    pool = ProcessPool(warm_size=1)
    runtime = ProcessRuntime(pool)
    try:
        runtime.prewarm_device("cpu")
        assert pool.size() == 1
        warm_pid = pool._warm["cpu"][0].pid
        spec = ReplicaSpec(
            replica_id="r1", function="f", entry="basic:Flaky", bundle_dir=str(FUNCTIONS)
        )
        replica = runtime.start(spec, lambda *_: None)
        assert replica.process.pid == warm_pid
        assert replica.phases_ms["process_start"] == 0.0  # paid before the request
        assert replica.phases_ms["pool_acquire"] > 0.0
        assert [u.kind for u in replica.call(CallRequest("c1", {}))] == ["succeeded"]
        deadline = time.monotonic() + 60
        while pool.size() < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pool.size() == 1 and pool._warm["cpu"][0].pid != warm_pid
        replica.stop()
    finally:
        runtime.close()
    assert pool.size() == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_on_a_machine_without_it_says_so() -> None:
    with pytest.raises(SpawnError, match="torch sees no CUDA device"):
        spawn_generic("cuda")


def _while_a_cpu_start_is_under_way(pool: ProcessPool) -> threading.Thread:
    """A thread filling ``pool`` for the CPU, returned once its start has begun."""
    filling = threading.Thread(target=pool.prewarm, args=("cpu",))
    filling.start()
    deadline = time.monotonic() + 30
    while pool.starting() == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert pool.starting() == 1
    return filling


def test_prewarm_returns_once_the_process_another_thread_is_starting_is_in() -> None:
    pool = ProcessPool(warm_size=1)
    try:
        filling = _while_a_cpu_start_is_under_way(pool)
        pool.prewarm("cpu")  # waits for that start instead of starting a second one
        assert pool.size() == 1 and pool.starting() == 0
        filling.join(timeout=30)
        assert pool.size() == 1
    finally:
        pool.close()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_a_cpu_start_under_way_does_not_stand_in_for_a_cuda_one() -> None:
    pool = ProcessPool(warm_size=1)
    try:
        filling = _while_a_cpu_start_is_under_way(pool)
        # The CUDA fill starts its own process (which, here, says why it cannot run).
        with pytest.raises(SpawnError, match="torch sees no CUDA device"):
            pool.prewarm("cuda")
        filling.join(timeout=30)
        assert pool.size() == 1
    finally:
        pool.close()


def model_spec(replica_id: str, registry_dir: Path, model: str, tmp_path: Path) -> ReplicaSpec:
    store = StoreSpec(
        url=str(registry_dir),
        cache_dir=str(tmp_path / "cache"),
        cache_max_bytes=1 << 30,
        bundles_dir=str(tmp_path / "bundles"),
        ram_tier_dir=str(tmp_path / "ram"),
        ram_tier_max_bytes=1 << 30,
    )
    return ReplicaSpec(
        replica_id=replica_id,
        function="lora",
        bundle_dir=str(FUNCTIONS / "lora_model"),
        entry="lora:Lora",
        model_digest=model,
        store=store,
    )


def test_a_pool_hit_skips_process_start_and_imports(tmp_path: Path, llama_dir: Path) -> None:
    registry = Registry(LocalStore(tmp_path / "store"))
    model = push_directory(llama_dir, "llama:v1", registry).digest
    spec = model_spec("r1", tmp_path / "store", model, tmp_path)
    pool = ProcessPool(warm_size=1, store=spec.store, preload=("transformers", "peft"))
    runtime = ProcessRuntime(pool)
    try:
        runtime.prewarm_device("cpu")
        [pooled] = pool._warm["cpu"]
        assert pooled.phases_ms["imports"] > 0.0  # paid by the pool, before any request
        # Another replica fills the disk cache after this process built its loader:
        assert spec.store is not None
        Snapshotter(registry, DiskCache(CacheConfig(Path(spec.store.cache_dir)))).load(model)
        replica = runtime.start(spec, lambda *_: None)
        assert replica.process.pid == pooled.pid
        assert runtime.pool_counts() in ((0, 1), (1, 1))  # idle (refilling), busy
        [done] = list(replica.call(CallRequest("c1", {"ids": [1, 2, 3]})))
        replica.stop()
        assert pool.busy() == 0
    finally:
        runtime.close()
    phases = replica.phases_ms
    assert phases["pool_acquire"] > 0.0
    assert phases["process_start"] == 0.0 and phases["device_init"] == 0.0
    # What remains of ``imports`` is the function's own module, which found the
    # heavy libraries already imported by the generic process:
    assert done.output["preloaded"] == ["peft", "torch", "transformers"]
    assert phases["imports"] < pooled.phases_ms["imports"]
    [load] = replica.loads  # its loader, built ahead, still sees what the cache holds now
    assert load.cache_bytes == load.tensor_bytes and load.store_gets == 0


def test_a_pool_miss_pays_process_start_and_imports(tmp_path: Path) -> None:
    runtime = ProcessRuntime(ProcessPool(warm_size=0))
    spec = ReplicaSpec(
        replica_id="r1", function="f", entry="basic:Flaky", bundle_dir=str(FUNCTIONS)
    )
    replica = runtime.start(spec, lambda *_: None)
    replica.stop()
    runtime.close()
    assert replica.phases_ms["pool_acquire"] == 0.0
    assert replica.phases_ms["process_start"] > 0.0 and replica.phases_ms["imports"] > 0.0


def test_a_replica_started_again_reads_its_weights_from_the_ram_tier(
    store_config: StoreConfig, tmp_path: Path, llama_dir: Path
) -> None:
    registry = Registry(open_store(store_config))
    model = push_directory(llama_dir, "llama:v1", registry)
    runtime = ProcessRuntime()
    loads = []
    try:
        for i in range(2):
            spec = model_spec(f"r{i}", tmp_path, model.digest, tmp_path)
            assert spec.store is not None
            store = spec.store.model_copy(
                update={
                    "url": store_config.url,
                    "s3_endpoint_url": store_config.s3.endpoint_url,
                    "s3_region": store_config.s3.region,
                    "s3_access_key_id": store_config.s3.access_key_id,
                    "s3_secret_access_key": store_config.s3.secret_access_key,
                }
            )
            replica = runtime.start(spec.model_copy(update={"store": store}), lambda *_: None)
            [done] = list(replica.call(CallRequest("c", {"ids": [1, 2, 3]})))
            assert done.kind == "succeeded", done.error
            replica.stop()
            [load] = replica.loads
            loads.append(load)
    finally:
        runtime.close()
    first, second = loads
    assert first.digest == second.digest == model.digest
    assert first.store_gets > 0 and first.ram_bytes == 0  # a cold worker: from the store
    assert second.ram_bytes == second.tensor_bytes > 0  # the same worker again: RAM only
    assert second.cache_hits == 0 and second.cache_bytes == 0
    assert second.store_gets == 0 and second.store_bytes == 0


def test_a_refilled_process_prepares_for_the_last_start_memory_and_imports(
    tmp_path: Path, llama_dir: Path
) -> None:
    registry = Registry(LocalStore(tmp_path / "store"))
    model = push_directory(llama_dir, "llama:v1", registry).digest
    spec = model_spec("r1", tmp_path / "store", model, tmp_path)
    spec.store = spec.store.model_copy(update={"ram_tier_max_bytes": 0}) if spec.store else None
    pool = ProcessPool(warm_size=1, store=spec.store, host_bytes_max=1 << 30)
    runtime = ProcessRuntime(pool)
    try:
        runtime.prewarm_device("cpu")
        first = runtime.start(spec, lambda *_: None)
        [first_load] = first.loads
        assert first_load.prefaulted_bytes == 0  # the pool knew of no load yet
        first.stop()
        deadline = time.monotonic() + 60
        while pool.size() < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        second = runtime.start(spec.model_copy(update={"replica_id": "r2"}), lambda *_: None)
        [second_load] = second.loads
        assert second_load.prefaulted_bytes == second_load.tensor_bytes > 0
        # What the first start imported (its model's transformers modules among them),
        # the refilled process imported while it waited: the second start did not.
        assert "transformers.models.llama.modeling_llama" in first.imports
        assert not set(first.imports) & set(second.imports)
        second.stop()
    finally:
        runtime.close()
