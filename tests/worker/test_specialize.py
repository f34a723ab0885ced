"""A replica loads a pushed bundle, model and adapters through the snapshotter."""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.torch import load_file

from snapshotter.config import StoreConfig
from snapshotter.manifest import ArtifactKind
from snapshotter.push import push_directory
from snapshotter.registry import Registry
from snapshotter.stores import open_store
from worker.child_protocol import AdapterRef, ReplicaSpec, StoreSpec
from worker.runtimes.base import CallRequest, ReplicaStartError
from worker.runtimes.process import ProcessRuntime

FUNCTIONS = Path(__file__).parent / "functions"


def store_spec(config: StoreConfig, tmp_path: Path) -> StoreSpec:
    return StoreSpec(
        url=config.url,
        s3_endpoint_url=config.s3.endpoint_url,
        s3_region=config.s3.region,
        s3_access_key_id=config.s3.access_key_id,
        s3_secret_access_key=config.s3.secret_access_key,
        cache_dir=str(tmp_path / "cache"),
        cache_max_bytes=1 << 30,
        bundles_dir=str(tmp_path / "bundles"),
    )


def test_replica_gets_weights_config_files_and_adapters(
    store_config: StoreConfig, tmp_path: Path, llama_dir: Path, adapter_dirs: list[Path]
) -> None:
    registry = Registry(open_store(store_config))
    model = push_directory(llama_dir, "llama:v1", registry)
    adapters = [push_directory(d, f"ad{i}:v1", registry) for i, d in enumerate(adapter_dirs)]
    bundle = push_directory(
        FUNCTIONS / "inspect_model", "fn/inspect:v1", registry, kind=ArtifactKind.BUNDLE
    )
    spec = ReplicaSpec(
        replica_id="r1",
        function="inspect",
        bundle_digest=bundle.digest,
        entry="app:Inspect",
        model_digest=model.digest,
        adapters=[AdapterRef(name=f"a{i}", digest=a.digest) for i, a in enumerate(adapters)],
        store=store_spec(store_config, tmp_path),
    )
    runtime = ProcessRuntime()
    replica = runtime.start(spec, lambda *_: None)
    try:
        for phase in ("weights_fetch", "weights_to_device", "adapters", "imports", "user_setup"):
            assert replica.phases_ms[phase] >= 0.0, phase
        [done] = list(replica.call(CallRequest("c1", input="report")))
        [total] = list(replica.call(CallRequest("c2", input="sum")))
    finally:
        replica.stop()
        runtime.close()
    report = done.output
    expected = {}
    for shard in llama_dir.glob("*.safetensors"):
        expected.update(load_file(shard))
    assert report["weights"] == {k: ["cpu", list(v.shape)] for k, v in expected.items()}
    assert report["config_model_type"] == "llama"
    assert "config.json" in report["files"]
    assert not any(name.endswith(".safetensors") for name in report["files"])
    assert report["adapters"] == {"a0": {"r": 8, "tensors": 8}, "a1": {"r": 8, "tensors": 8}}
    first = sorted(expected)[0]
    assert total.output == pytest.approx(float(expected[first].double().sum()))


def test_unknown_bundle_digest_fails_the_start(tmp_path: Path) -> None:
    spec = ReplicaSpec(
        replica_id="r1",
        function="f",
        bundle_digest="blake3:" + "ab" * 32,
        entry="app:X",
        store=store_spec(StoreConfig(url=str(tmp_path / "store")), tmp_path),
    )
    runtime = ProcessRuntime()
    try:
        with pytest.raises(ReplicaStartError, match="not in store"):
            runtime.start(spec, lambda *_: None)
    finally:
        runtime.close()
