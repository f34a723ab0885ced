"""The example function with [batching] in real replicas: one batch, the same answers
as the unbatched replica, each call with its own result and stream."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from examples.build_model import build_all
from snapshotter.config import StoreConfig
from snapshotter.manifest import ArtifactKind
from snapshotter.push import push_directory
from snapshotter.registry import Registry
from snapshotter.stores import open_store
from tests.worker.streamed import streamed as stream_chunks
from tests.worker.test_example import EXAMPLE, PROMPT
from tests.worker.test_specialize import store_spec
from worker.child_protocol import ReplicaSpec
from worker.runtimes.base import CallRequest, CallUpdate
from worker.runtimes.process import ProcessReplica, ProcessRuntime

pytestmark = pytest.mark.slow  # two replicas of the example model start

BATCH = 3


@dataclass
class Pair:
    plain: ProcessReplica
    batched: ProcessReplica  # max_batch_size 3, a wait only a full batch ends


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    tmp = tmp_path_factory.mktemp("example-batched")
    dirs = build_all(tmp / "built")
    config = StoreConfig(url=str(tmp / "store"))
    registry = Registry(open_store(config))
    model = push_directory(dirs["model"], "textgen-llama:v1", registry)
    bundle = push_directory(EXAMPLE, "fn/textgen:v1", registry, kind=ArtifactKind.BUNDLE)
    spec = ReplicaSpec(
        replica_id="plain",
        function="textgen",
        bundle_digest=bundle.digest,
        entry="app:TextGen",
        model_digest=model.digest,
        store=store_spec(config, tmp),
    )
    batched_spec = spec.model_copy(
        update={"replica_id": "batched", "max_batch_size": BATCH, "max_wait_ms": 600_000.0}
    )
    runtime = ProcessRuntime()
    plain = runtime.start(spec, lambda *_: None)
    batched = runtime.start(batched_spec, lambda *_: None)
    yield Pair(plain, batched)
    plain.stop()
    batched.stop()
    runtime.close()


def together(replica: ProcessReplica, requests: list[CallRequest]) -> list[list[CallUpdate]]:
    """Send the requests at once (one batch of BATCH); every call's updates, in order."""
    got: list[list[CallUpdate]] = [[] for _ in requests]

    def run(i: int) -> None:
        got[i] = list(replica.call(requests[i]))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return got


def prompt(text: str) -> dict[str, object]:
    return {**PROMPT, "prompt": text}


def test_a_batch_answers_each_call_as_the_unbatched_replica_does(pair: Pair) -> None:
    # Equal lengths: no padding, so the batch's arithmetic is each prompt's own.
    texts = ["The quick brown fox", "The quick brown cat", "The slow brown fox"]
    expected = [
        list(pair.plain.call(CallRequest(f"p{i}", prompt(t))))[-1].output
        for i, t in enumerate(texts)
    ]
    done = together(pair.batched, [CallRequest(f"b{i}", prompt(t)) for i, t in enumerate(texts)])
    for updates, want in zip(done, expected, strict=True):
        [final] = updates
        assert final.kind == "succeeded", final.error
        assert final.batch_size == BATCH and final.output == want


def test_streaming_and_padded_prompts_share_a_batch(pair: Pair) -> None:
    short, long = prompt("Hi"), prompt("Once upon a time, in a land far away, there lived")
    done = together(
        pair.batched,
        [CallRequest("s", long, stream=True), CallRequest("w", long), CallRequest("x", short)],
    )
    streamed, whole, other = done
    pieces = [chunk["text"] for chunk in stream_chunks(streamed)[1]]
    assert streamed[-1].kind == "succeeded" and streamed[-1].output is None
    assert whole[-1].kind == "succeeded" and "".join(pieces) == whole[-1].output["text"]
    assert len(pieces) == whole[-1].output["tokens"] >= 1
    assert other[-1].kind == "succeeded" and 1 <= other[-1].output["tokens"] <= 12
    assert {u[-1].batch_index for u in done} == {0, 1, 2}


def test_a_bad_input_fails_only_its_call(pair: Pair) -> None:
    done = together(
        pair.batched,
        [
            CallRequest("a", PROMPT),
            CallRequest("b", {"text": "no prompt"}),
            CallRequest("c", PROMPT),
        ],
    )
    assert [u[-1].kind for u in done] == ["succeeded", "failed", "succeeded"]
    assert "prompt" in (done[1][-1].error or "")
    assert done[0][-1].output == done[2][-1].output
