"""The example function (examples/textgen) in a real replica: text, streaming, adapters."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from examples.build_model import build_all
from snapshotter.config import StoreConfig
from snapshotter.manifest import ArtifactKind
from snapshotter.push import push_directory
from snapshotter.registry import Registry
from snapshotter.stores import open_store
from tests.worker.streamed import streamed
from tests.worker.test_specialize import store_spec
from worker.child_protocol import AdapterRef, ReplicaSpec
from worker.runtimes.base import CallRequest, CallUpdate
from worker.runtimes.process import ProcessReplica, ProcessRuntime

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "textgen"
PROMPT = {"prompt": "The quick brown fox", "max_tokens": 12}


@dataclass
class Example:
    replica: ProcessReplica
    registry: Registry
    model_digest: str


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Example]:
    tmp = tmp_path_factory.mktemp("example")
    dirs = build_all(tmp / "built")
    config = StoreConfig(url=str(tmp / "store"))
    registry = Registry(open_store(config))
    model = push_directory(dirs["model"], "textgen-llama:v1", registry)
    adapters = [
        AdapterRef(
            name=name, digest=push_directory(dirs[name], f"textgen-{name}:v1", registry).digest
        )
        for name in ("pirate", "poet")
    ]
    bundle = push_directory(EXAMPLE, "fn/textgen:v1", registry, kind=ArtifactKind.BUNDLE)
    spec = ReplicaSpec(
        replica_id="r1",
        function="textgen",
        bundle_digest=bundle.digest,
        entry="app:TextGen",
        model_digest=model.digest,
        adapters=adapters,
        store=store_spec(config, tmp),
    )
    runtime = ProcessRuntime()
    handle = runtime.start(spec, lambda *_: None)
    yield Example(handle, registry, model.digest)
    handle.stop()
    runtime.close()


@pytest.fixture
def replica(example: Example) -> ProcessReplica:
    return example.replica


def call(replica: ProcessReplica, input: object, **kw: object) -> list[CallUpdate]:
    return list(replica.call(CallRequest(call_id="c", input=input, **kw)))  # type: ignore[arg-type]


def test_generates_text_from_the_prompt(replica: ProcessReplica) -> None:
    [done] = call(replica, PROMPT)
    assert done.kind == "succeeded", done.error
    assert isinstance(done.output["text"], str) and done.output["text"]
    assert 1 <= done.output["tokens"] <= 12


def test_streams_the_same_text_piece_by_piece(replica: ProcessReplica) -> None:
    [whole] = call(replica, PROMPT)
    updates = call(replica, PROMPT, stream=True)
    pieces = [chunk["text"] for chunk in streamed(updates)[1]]
    assert updates[-1].kind == "succeeded"
    assert len(pieces) == whole.output["tokens"] and len(pieces) > 1
    assert "".join(pieces) == whole.output["text"]


def test_adapters_change_the_text_and_switch_per_call(replica: ProcessReplica) -> None:
    base = call(replica, PROMPT)[0].output["text"]
    pirate = call(replica, PROMPT, adapter="pirate")[0].output["text"]
    poet = call(replica, PROMPT, adapter="poet")[0].output["text"]
    assert len({base, pirate, poet}) == 3
    assert call(replica, PROMPT)[0].output["text"] == base  # back to the base model


def test_an_unlisted_adapter_is_loaded_by_name_and_tag_on_first_use(
    replica: ProcessReplica,
) -> None:
    poet = call(replica, PROMPT, adapter="poet")[0]
    [first] = call(replica, PROMPT, adapter="textgen-poet:v1")  # the same weights, unlisted
    [again] = call(replica, PROMPT, adapter="textgen-poet:v1")
    assert first.kind == "succeeded", first.error
    assert first.output["text"] == poet.output["text"] == again.output["text"]
    assert (poet.adapter_hit, first.adapter_hit, again.adapter_hit) == (True, False, True)
    assert first.timings_ms["adapter_load"] > 0.0 == again.timings_ms["adapter_load"]


def test_unknown_adapter_and_bad_input_fail_the_call_only(replica: ProcessReplica) -> None:
    [unknown] = call(replica, PROMPT, adapter="klingon")
    assert unknown.kind == "failed" and "adapter 'klingon' is not listed" in (unknown.error or "")
    [bad] = call(replica, {"text": "no prompt"})
    assert bad.kind == "failed" and "prompt" in (bad.error or "")
    [misspelt] = call(replica, {"prompt": "Hello", "max_new_tokens": 5})
    assert misspelt.kind == "failed"
    assert "unknown input keys ['max_new_tokens']" in (misspelt.error or "")
    assert "max_tokens" in (misspelt.error or "")  # what it takes instead
    assert call(replica, PROMPT)[0].kind == "succeeded"


def test_first_call_records_the_prefetch_profile(example: Example) -> None:
    assert call(example.replica, PROMPT)[0].kind == "succeeded"
    order = example.registry.get_profile(example.model_digest)
    assert order is not None
    # The forward pass's order: embeddings first, the output head last.
    assert order[0] == "model.embed_tokens.weight"
    assert order.index("model.layers.0.self_attn.q_proj.weight") < order.index("lm_head.weight")
