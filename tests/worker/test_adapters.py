"""LoRA adapters: listed ones preloaded, others loaded on first use under an LRU cap,
switched per call with each adapter's own output (checked against PEFT in-process)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from control_plane.protocol import RunCall, StartReplica
from snapshotter.manifest import ArtifactKind
from snapshotter.push import push_directory
from snapshotter.registry import Registry
from snapshotter.stores import LocalStore
from tests.worker.recorder import Recorder
from worker.adapters import AdapterCache, adapters_to_evict
from worker.child_protocol import AdapterRef, ReplicaSpec, StoreSpec
from worker.replicas import ReplicaManager
from worker.runtimes.base import CallRequest, CallUpdate, OnExit
from worker.runtimes.process import ProcessReplica, ProcessRuntime
from worker.sdk import Adapter

FUNCTIONS = Path(__file__).parent / "functions"
IDS = [1, 5, 9, 42, 7]


# --- the eviction decision -------------------------------------------------------
def test_oldest_unpinned_idle_adapters_go_first() -> None:
    order = ["pinned", "old", "busy", "mid", "new"]
    assert adapters_to_evict(order, {"pinned"}, {"busy"}, cap=2) == ["old", "mid"]
    assert adapters_to_evict(order, {"pinned"}, set(), cap=4) == []
    assert adapters_to_evict(order, set(), set(), cap=0) == order


@given(
    st.lists(st.sampled_from("abcdefgh"), unique=True),
    st.sets(st.sampled_from("abcdefgh")),
    st.sets(st.sampled_from("abcdefgh")),
    st.integers(min_value=0, max_value=8),
)
def test_eviction_keeps_pinned_and_busy_and_meets_the_cap_when_it_can(
    order: list[str], pinned: set[str], in_use: set[str], cap: int
) -> None:
    victims = adapters_to_evict(order, pinned, in_use, cap)
    assert not set(victims) & (pinned | in_use)
    left = [n for n in order if n not in victims and n not in pinned]
    evictable_left = [n for n in left if n not in in_use]
    assert len(left) <= cap or not evictable_left
    assert victims == [n for n in order if n in victims]  # oldest first


def test_cache_counts_hits_and_misses_and_unloads_the_least_recent() -> None:
    fetched: list[str] = []
    unloaded: list[str] = []

    def fetch(name: str) -> Adapter:
        fetched.append(name)
        return Adapter(name, {}, {})

    adapters = {"listed": Adapter("listed", {}, {})}
    cache = AdapterCache(adapters, fetch, cap=1, on_unload=unloaded.append)
    with cache.use("listed") as use:
        assert use.hit and use.load_ms == 0.0
    with cache.use("x") as use:
        assert not use.hit and use.load_ms >= 0.0
        with cache.use("y") as inner:  # x is in use: the cache may exceed its cap
            assert not inner.hit
        assert "x" in adapters
    assert unloaded == ["y"]  # when y's call ended, x was still in use
    assert set(adapters) == {"listed", "x"}
    assert (cache.stats.hits, cache.stats.misses) == (1, 2)
    assert fetched == ["x", "y"]


def test_a_failed_fetch_holds_nothing() -> None:
    def fetch(name: str) -> Adapter:
        raise LookupError(f"no adapter {name}")

    cache = AdapterCache({}, fetch, cap=2)
    with pytest.raises(LookupError, match="no adapter nope"), cache.use("nope"):
        pass
    assert cache.adapters == {} and cache.stats.misses == 0


def test_an_adapter_the_function_refuses_is_not_kept() -> None:
    def refuse(adapter: Adapter) -> None:
        raise ValueError(f"rank of {adapter.name} too large")

    cache = AdapterCache({}, lambda name: Adapter(name, {}, {}), cap=2, on_load=refuse)
    with pytest.raises(ValueError, match="too large"), cache.use("big:v1"):
        pass
    assert cache.adapters == {}
    with pytest.raises(ValueError), cache.use("big:v1"):  # tried again, not a hit
        pass


# --- in a replica process, against PEFT ------------------------------------------
def _store_spec(store_dir: Path, tmp_path: Path) -> StoreSpec:
    return StoreSpec(
        url=str(store_dir),
        cache_dir=str(tmp_path / "cache"),
        cache_max_bytes=1 << 30,
        bundles_dir=str(tmp_path / "bundles"),
    )


def _call(replica: ProcessReplica, call_id: str, adapter: str | None) -> CallUpdate:
    [update] = list(replica.call(CallRequest(call_id, {"ids": IDS}, adapter=adapter)))
    assert update.kind == "succeeded", update.error
    return update


def _peft_logits(llama_dir: Path, adapter_dirs: list[Path]) -> dict[str | None, torch.Tensor]:
    from peft import PeftModel
    from transformers import LlamaForCausalLM

    base = LlamaForCausalLM.from_pretrained(llama_dir).eval()
    model = PeftModel.from_pretrained(base, adapter_dirs[0], adapter_name="a0").eval()
    model.load_adapter(str(adapter_dirs[1]), adapter_name="a1")
    out: dict[str | None, torch.Tensor] = {}
    ids = torch.tensor([IDS])
    with torch.inference_mode():
        for name in ("a0", "a1"):
            model.set_adapter(name)
            out[name] = model(input_ids=ids).logits[0, -1]
        with model.disable_adapter():
            out[None] = model(input_ids=ids).logits[0, -1]
    return out


@pytest.mark.parametrize("cache_size", [8, 0])
def test_per_call_adapters_match_peft_and_unlisted_ones_load_on_first_use(
    cache_size: int, tmp_path: Path, llama_dir: Path, adapter_dirs: list[Path]
) -> None:
    registry = Registry(LocalStore(tmp_path / "store"))
    model = push_directory(llama_dir, "llama:v1", registry)
    listed = push_directory(adapter_dirs[0], "ad0:v1", registry)
    push_directory(adapter_dirs[1], "ad1:v1", registry)
    assert listed.kind is ArtifactKind.ADAPTER
    spec = ReplicaSpec(
        replica_id="r1",
        function="lora",
        bundle_dir=str(FUNCTIONS / "lora_model"),
        entry="lora:Lora",
        model_digest=model.digest,
        adapters=[AdapterRef(name="a0", digest=listed.digest)],
        store=_store_spec(tmp_path / "store", tmp_path),
        adapter_cache_size=cache_size,
    )
    runtime = ProcessRuntime()
    replica = runtime.start(spec, lambda *_: None)
    try:
        assert replica.phases_ms["adapters"] > 0.0  # the listed one, before ready
        first = _call(replica, "c1", "a0")
        miss = _call(replica, "c2", "ad1:v1")
        again = _call(replica, "c3", "ad1:v1")
        base = _call(replica, "c4", None)
        unknown = list(replica.call(CallRequest("c5", {"ids": IDS}, adapter="nope:v9")))
    finally:
        replica.stop()
        runtime.close()
    assert first.adapter_hit is True and first.timings_ms["adapter_load"] == 0.0
    assert first.output["loaded"] == ["a0"]  # preloaded before ready
    assert miss.adapter_hit is False and miss.timings_ms["adapter_load"] > 0.0
    # What the replica reports holding after each call (the router's view).
    assert miss.loaded_adapters == (["a0", "ad1:v1"] if cache_size else ["a0"])
    assert base.loaded_adapters is None  # a call without an adapter changes nothing
    assert again.adapter_hit is (cache_size > 0)
    assert again.output["loaded"] == ["a0", "ad1:v1"]  # during the call it is loaded
    assert base.adapter_hit is None and "adapter_load" not in base.timings_ms
    assert base.output["loaded"] == (["a0", "ad1:v1"] if cache_size else ["a0"])
    [failed] = unknown
    assert failed.kind == "failed" and "not listed by the function" in (failed.error or "")
    expected = _peft_logits(llama_dir, adapter_dirs)
    for update, name in ((first, "a0"), (miss, "a1"), (again, "a1"), (base, None)):
        got = torch.tensor(update.output["logits"])
        torch.testing.assert_close(got, expected[name], rtol=1e-4, atol=1e-5)
    assert not torch.allclose(expected["a0"], expected["a1"])  # the comparison can fail


def test_the_call_event_says_whether_the_adapter_was_loaded_and_how_long_it_took(
    tmp_path: Path, llama_dir: Path, adapter_dirs: list[Path]
) -> None:
    registry = Registry(LocalStore(tmp_path / "store"))
    model = push_directory(llama_dir, "llama:v1", registry)
    push_directory(adapter_dirs[1], "ad1:v1", registry)
    recorder = Recorder()
    runtime = LoraRuntime()
    manager = ReplicaManager(runtime, recorder.client(), _store_spec(tmp_path / "store", tmp_path))
    try:
        manager.start_replica(
            StartReplica(
                replica_id="r1",
                function="lora",
                version=1,
                bundle_digest="blake3:" + "0" * 64,
                entry="lora:Lora",
                model_digest=model.digest,
            )
        )
        for call_id in ("c1", "c2"):
            manager.run_call(
                RunCall(
                    call_id=call_id,
                    replica_id="r1",
                    function="lora",
                    input={"ids": IDS},
                    adapter="ad1:v1",
                    accepted_at=time.time(),
                )
            )
    finally:
        manager.close()
        manager.stop_all()
        runtime.close()
    [miss] = [e for e in recorder.events("/v1/calls/c1/") if e["kind"] == "succeeded"]
    [hit] = [e for e in recorder.events("/v1/calls/c2/") if e["kind"] == "succeeded"]
    assert miss["adapter_hit"] is False and miss["timings_ms"]["adapter_load"] > 0.0
    assert hit["adapter_hit"] is True and hit["timings_ms"]["adapter_load"] == 0.0
    assert miss["loaded_adapters"] == hit["loaded_adapters"] == ["ad1:v1"]


class LoraRuntime(ProcessRuntime):
    """Runs the LoRA test function from its directory instead of a pushed bundle."""

    def start(self, spec: ReplicaSpec, on_exit: OnExit) -> ProcessReplica:
        local = spec.model_copy(update={"bundle_dir": str(FUNCTIONS / "lora_model")})
        return super().start(local, on_exit)
