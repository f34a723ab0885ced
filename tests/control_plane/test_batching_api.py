"""Batching through the whole platform: a served control plane, a real ``thaw worker``
and its replica process; four calls become one batch and keep their own records."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import httpx
import pytest

from snapshotter.manifest import ArtifactKind
from snapshotter.push import push_directory
from snapshotter.registry import Registry
from snapshotter.stores import LocalStore
from tests.control_plane.conftest import StoreFixture
from tests.control_plane.test_end_to_end import running_stack

pytestmark = pytest.mark.slow

CODE = """
class Doubler:
    def batch(self, inputs, calls):
        return [{"y": 2 * x, "batch": len(inputs), "call_id": c.call_id}
                for x, c in zip(inputs, calls)]
"""


def _bundle(cp_store: StoreFixture, tmp_path: Path) -> str:
    d = tmp_path / "batch-code"
    d.mkdir()
    (d / "app.py").write_text(CODE)
    registry = Registry(LocalStore(cp_store.root))
    return push_directory(d, "bundles/batch:v1", registry, kind=ArtifactKind.BUNDLE).digest


def _metric(text: str, name: str) -> float:
    m = re.search(rf'^{name}\{{function="doubler"\}} ([0-9.e+]+)$', text, re.M)
    assert m is not None, f"{name} missing from /metrics"
    return float(m.group(1))


def test_calls_sent_together_form_one_batch_and_keep_their_own_records(
    tmp_path: Path, cp_store: StoreFixture
) -> None:
    spec = {
        "name": "doubler",
        "entry": "app:Doubler",
        "bundle": _bundle(cp_store, tmp_path),
        "device": "cpu",
        "timeout_s": 120,
        # target_concurrency 1: only the batch size lets one replica take all four
        "scaling": {"max_replicas": 1, "target_concurrency": 1},
        # a minute: a full batch of four goes at once, anything less would show in "batch"
        "batching": {"max_batch_size": 4, "max_wait_ms": 60_000},
    }
    with running_stack(tmp_path, cp_store, None) as (c, proc):
        assert c.post("/v1/functions", json=spec).status_code == 201
        answers: dict[int, httpx.Response] = {}

        def invoke(x: int) -> None:
            answers[x] = c.post("/v1/functions/doubler/invoke", json={"input": x})

        threads = [threading.Thread(target=invoke, args=(x,)) for x in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=150)
        assert sorted(answers) == [0, 1, 2, 3], proc.poll()
        ids = set()
        for x, r in answers.items():
            assert r.status_code == 200, r.text
            call_id = r.headers["X-Thaw-Call-Id"]
            assert r.json()["output"] == {"y": 2 * x, "batch": 4, "call_id": call_id}
            record = c.get(f"/v1/calls/{call_id}").json()
            assert record["status"] == "succeeded" and "batch_wait" in record["timings_ms"]
            ids.add(call_id)
        assert len(ids) == 4
        text = c.get("/metrics").text
        assert _metric(text, "thaw_batch_size_count") == 1  # one batch, counted once
        assert _metric(text, "thaw_batch_size_sum") == 4
        assert _metric(text, "thaw_batch_size_max") == 4
