"""Deploy a function on an image through a served control plane and a real ``thaw worker``.

The worker runs the replica in a container over the lazily mounted image;
the model's weights stream from the worker's cache, mounted read-only.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from snapshotter.images import push_image_archive
from snapshotter.manifest import ArtifactKind
from snapshotter.push import push_directory
from snapshotter.registry import Registry
from snapshotter.stores import LocalStore
from tests.control_plane.conftest import StoreFixture
from tests.control_plane.test_end_to_end import running_stack
from tests.docker.conftest import containers_under

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

CODE = """
from pathlib import Path


class Info:
    def setup(self, ctx):
        self.tensors = len(ctx.weights)

    def __call__(self, input):
        return {"input": input, "tensors": self.tensors,
                "debian": Path("/etc/debian_version").read_text().strip()}
"""


@pytest.fixture
def store(tmp_path: Path, llama_dir: Path, engine_image: str) -> StoreFixture:
    root = tmp_path / "store"
    registry = Registry(LocalStore(root))
    push_directory(llama_dir, "llama-tiny:v1", registry)
    code = tmp_path / "code"
    code.mkdir()
    (code / "app.py").write_text(CODE)
    bundle = push_directory(code, "bundles/img:v1", registry, kind=ArtifactKind.BUNDLE).digest
    with subprocess.Popen(["docker", "save", engine_image], stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        push_image_archive(proc.stdout, "base:v1", registry)
    return StoreFixture(root, "llama-tiny:v1", [], bundle, bundle, bundle, bundle)


def test_deploy_on_an_image_cold_warm_and_scale_to_zero(
    store: StoreFixture, tmp_path: Path
) -> None:
    with running_stack(tmp_path, store, None) as (c, proc):
        spec = {
            "name": "imgfn",
            "entry": "app:Info",
            "bundle": store.good_bundle,
            "model": store.model_ref,
            "device": "cpu",
            "timeout_s": 300,
            "runtime": "docker",
            "image": "base:v1",
            "scaling": {"min_replicas": 0, "max_replicas": 1, "idle_timeout_s": 3},
        }
        r = c.post("/v1/functions", json=spec)
        assert r.status_code == 201, r.text

        cold = c.post("/v1/functions/imgfn/invoke", json={"input": 1}, timeout=600)
        assert cold.status_code == 200, (cold.text, proc.poll())
        out = cold.json()["output"]
        assert out["debian"].startswith("12.") and out["tensors"] > 0
        assert cold.headers["X-Thaw-Cold"] == "true"
        timing = cold.headers["Server-Timing"]
        assert "image_fetch;dur=" in timing and "weights_fetch;dur=" in timing
        assert len(containers_under(tmp_path, running_only=True)) == 1

        warm = c.post("/v1/functions/imgfn/invoke", json={"input": 2})
        assert warm.status_code == 200 and warm.headers["X-Thaw-Cold"] == "false"

        deadline = time.monotonic() + 120
        while containers_under(tmp_path, running_only=True) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert containers_under(tmp_path, running_only=True) == [], (
            "the idle replica's container was not removed"
        )

        again = c.post("/v1/functions/imgfn/invoke", json={"input": 3}, timeout=600)
        assert again.status_code == 200 and again.headers["X-Thaw-Cold"] == "true"
