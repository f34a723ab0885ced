"""The real thing: a served control plane dispatching through Celery (filesystem,
Redis and RabbitMQ brokers) to a real ``thaw worker`` process, which starts real
replica processes that stream the tiny Llama's weights from the store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import torch

from control_plane.api.app import create_app
from snapshotter.manifest import ArtifactKind
from snapshotter.push import push_directory
from snapshotter.registry import Registry
from snapshotter.stores import LocalStore
from tests.control_plane.conftest import StoreFixture, make_settings
from tests.control_plane.server import serve

pytestmark = pytest.mark.slow

CODE = """
class Weights:
    def setup(self, ctx):
        self.device = ctx.device
        self.tensors = len(ctx.weights)
        self.hidden = ctx.config.get("hidden_size")
        self.adapters = sorted(ctx.adapters)

    def __call__(self, input, call=None):
        return {"input": input, "device": self.device, "tensors": self.tensors,
                "hidden": self.hidden, "adapters": self.adapters,
                "adapter": call.adapter if call else None}


class Count:
    def __call__(self, input):
        for i in range(int(input["n"])):
            yield {"i": i}
"""

BROKERS = {
    "filesystem": None,
    "redis": "redis://127.0.0.1:6379/0",
    "rabbitmq": "amqp://guest:guest@127.0.0.1:5672//",
}


@pytest.fixture(scope="module")
def e2e_bundle(cp_store: StoreFixture, tmp_path_factory: pytest.TempPathFactory) -> str:
    d = tmp_path_factory.mktemp("e2e-code")
    (d / "app.py").write_text(CODE)
    registry = Registry(LocalStore(cp_store.root))
    return push_directory(d, "bundles/e2e:v1", registry, kind=ArtifactKind.BUNDLE).digest


@contextmanager
def running_stack(
    tmp_path: Path, cp_store: StoreFixture, broker: str | None
) -> Iterator[tuple[httpx.Client, subprocess.Popen[bytes]]]:
    """A served control plane and a ``thaw worker`` process attached to it."""
    settings = make_settings(
        tmp_path,
        f"sqlite:///{tmp_path / 'thaw.db'}",
        cp_store.root,
        broker_url=broker,
        heartbeat_interval_s=1.0,
    )
    app = create_app(settings)
    with serve(app) as url:
        admin = httpx.Client(
            base_url=url,
            headers={"Authorization": f"Bearer {app.state.bootstrap_admin_key}"},
            timeout=120,
        )
        worker_key = admin.post("/v1/keys", json={"scopes": ["worker"]}).json()["token"]
        env = {
            **os.environ,
            "THAW_HOME": str(settings.home),
            "THAW_SERVER_URL": url,
            "THAW_API_KEY": worker_key,
            "THAW_STORE": str(cp_store.root),
            "THAW_WORKER_NAME": f"e2e-{uuid.uuid4().hex[:6]}",
        }
        if broker:
            env["THAW_BROKER_URL"] = broker
        log = open(tmp_path / "worker.log", "wb")  # noqa: SIM115 - closed below
        proc = subprocess.Popen(
            [sys.executable, "-c", "from cli.main import app; app()", "worker"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            yield admin, proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()
            admin.close()


@pytest.fixture(params=list(BROKERS))
def stack(
    request: pytest.FixtureRequest, tmp_path: Path, cp_store: StoreFixture
) -> Iterator[tuple[httpx.Client, subprocess.Popen[bytes]]]:
    with running_stack(tmp_path, cp_store, BROKERS[request.param]) as s:
        yield s


def test_deploy_invoke_stream_on_a_real_worker(
    stack: tuple[httpx.Client, subprocess.Popen[bytes]],
    cp_store: StoreFixture,
    e2e_bundle: str,
) -> None:
    c, proc = stack
    adapters = [{"name": "a0", "ref": cp_store.adapter_refs[0]}]
    base = {"bundle": e2e_bundle, "model": cp_store.model_ref, "device": "cpu", "timeout_s": 120}
    r = c.post(
        "/v1/functions",
        json={**base, "name": "weights", "entry": "app:Weights", "adapters": adapters},
    )
    assert r.status_code == 201, r.text
    r = c.post("/v1/functions", json={**base, "name": "count", "entry": "app:Count"})
    assert r.status_code == 201, r.text

    r = c.post("/v1/functions/weights/invoke", json={"input": {"q": 1}, "adapter": "a0"})
    assert r.status_code == 200, (r.text, proc.poll())
    out = r.json()["output"]
    assert out["input"] == {"q": 1} and out["device"] == "cpu"
    assert out["tensors"] > 0 and out["hidden"] == 64
    assert out["adapters"] == ["a0"] and out["adapter"] == "a0"
    assert r.headers["X-Thaw-Cold"] == "true"
    assert "weights_fetch;dur=" in r.headers["Server-Timing"]

    warm = c.post("/v1/functions/weights/invoke", json={"input": 2})
    assert warm.status_code == 200 and warm.headers["X-Thaw-Cold"] == "false"

    with c.stream(
        "POST",
        "/v1/functions/count/invoke",
        json={"input": {"n": 3}},
        headers={"Accept": "text/event-stream"},
    ) as s:
        text = "".join(s.iter_text())
    events = [b.split("\n") for b in text.strip().split("\n\n")]
    kinds = [e[0].removeprefix("event: ") for e in events]
    assert kinds == ["output", "output", "output", "done"]
    assert [json.loads(e[1].removeprefix("data: ")) for e in events[:3]] == [
        {"i": 0},
        {"i": 1},
        {"i": 2},
    ]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_function_is_placed_on_the_gpu(
    tmp_path: Path, cp_store: StoreFixture, e2e_bundle: str
) -> None:
    with running_stack(tmp_path, cp_store, None) as (c, _):
        spec = {
            "name": "weights",
            "entry": "app:Weights",
            "bundle": e2e_bundle,
            "model": cp_store.model_ref,
            "device": "cuda",
            "timeout_s": 120,
        }
        assert c.post("/v1/functions", json=spec).status_code == 201
        r = c.post("/v1/functions/weights/invoke", json={"input": 1})
        assert r.status_code == 200, r.text
        assert r.json()["output"]["device"] == "cuda"
        assert "weights_to_device;dur=" in r.headers["Server-Timing"]
