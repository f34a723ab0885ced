"""What the cold-start bench sets up (untimed): the example model, stores, and thaw itself.

thaw runs as it does in production: ``thaw server`` and ``thaw worker`` as
separate OS processes (SQLite + the filesystem broker, like ``thaw up``),
configured only through ``THAW_*`` variables. The process handling is the
end-to-end tests' ``Stack``; ``BenchStack`` adds per-stack variables
(pool size, cache directory, store URL).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench._common import REPO_ROOT
from bench._load_setup import S3_KEYS, S3_REGION, s3_client
from tests.e2e.stack import Backend, Stack, wait_for

EXAMPLE_DIR = REPO_ROOT / "examples" / "textgen"
MODEL_REF = "textgen-llama:v1"
ADAPTERS = ("pirate", "poet")
BUNDLE_REF = "bundles/textgen:v1"
RAW_BUCKET = "bench-raw"
THAW_BUCKET = "bench-thaw"
_POOL_IDLE = re.compile(r'^thaw_worker_pool_idle\{worker="([^"]+)"\}\s+(\S+)$', re.MULTILINE)


@dataclass(frozen=True)
class ModelSize:
    hidden_size: int
    num_layers: int
    adapter_r: int
    max_shard_size: str

    @property
    def tag(self) -> str:
        return f"h{self.hidden_size}-l{self.num_layers}-r{self.adapter_r}"


FULL_MODEL = ModelSize(hidden_size=768, num_layers=8, adapter_r=16, max_shard_size="50MB")
QUICK_MODEL = ModelSize(hidden_size=64, num_layers=2, adapter_r=16, max_shard_size="100KB")


def ensure_example(data_dir: Path, size: ModelSize) -> dict[str, Path]:
    """The example model and its adapters, built once per size under ``data_dir``."""
    from examples.build_model import build_all

    out = data_dir / f"example-{size.tag}"
    names = {"model": out / "model", **{n: out / "adapters" / n for n in ADAPTERS}}
    if (out / ".built").is_file():
        return names
    shutil.rmtree(out, ignore_errors=True)
    built = build_all(
        out,
        hidden_size=size.hidden_size,
        num_layers=size.num_layers,
        adapter_r=size.adapter_r,
        max_shard_size=size.max_shard_size,
    )
    (out / ".built").write_text("ok\n")
    return {k: built[k] for k in names}


def model_bytes(model_dir: Path) -> int:
    return sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))


def push_example(dirs: dict[str, Path], store_url: str, endpoint_url: str | None) -> str:
    """Push model, adapters and the textgen bundle to a store; return the bundle digest."""
    from snapshotter.config import S3Config, StoreConfig
    from snapshotter.manifest import ArtifactKind
    from snapshotter.push import push_directory
    from snapshotter.registry import Registry
    from snapshotter.stores import open_store

    s3 = S3Config(
        endpoint_url, S3_REGION, S3_KEYS["aws_access_key_id"], S3_KEYS["aws_secret_access_key"]
    )
    registry = Registry(open_store(StoreConfig(store_url, s3)))
    push_directory(dirs["model"], MODEL_REF, registry)
    for name in ADAPTERS:
        push_directory(dirs[name], f"textgen-{name}:v1", registry)
    bundle = push_directory(EXAMPLE_DIR, BUNDLE_REF, registry, kind=ArtifactKind.BUNDLE)
    return bundle.digest


def upload_raw(endpoint_url: str, model_dir: Path) -> dict[str, Any]:
    """The model directory as plain S3 objects (what a boto3 user downloads)."""
    client = s3_client(endpoint_url)
    client.create_bucket(Bucket=RAW_BUCKET)
    for f in sorted(p for p in model_dir.iterdir() if p.is_file()):
        client.upload_file(str(f), RAW_BUCKET, f"model/{f.name}")
    return {"endpoint_url": endpoint_url, "bucket": RAW_BUCKET, "prefix": "model/"}


def function_spec(
    bundle: str, name: str, *, min_replicas: int, idle_timeout_s: float
) -> dict[str, Any]:
    """The textgen example, on the CPU, with both adapters preloaded."""
    return {
        "name": name,
        "bundle": bundle,
        "entry": "app:TextGen",
        "model": MODEL_REF,
        "adapters": [{"name": n, "ref": f"textgen-{n}:v1"} for n in ADAPTERS],
        "device": "cpu",
        "timeout_s": 300,
        "scaling": {
            "min_replicas": min_replicas,
            "max_replicas": 1,
            "idle_timeout_s": idle_timeout_s,
        },
    }


@dataclass
class BenchStack(Stack):
    """A ``Stack`` whose processes get ``extra_env`` on top of the usual variables."""

    extra_env: dict[str, str] = field(default_factory=dict)

    def env(self, **extra: str) -> dict[str, str]:
        return {**super().env(**extra), **self.extra_env}

    def live_replicas(self, function: str) -> int:
        return sum(
            1
            for w in self.workers()
            for r in w["replicas"]
            if r["function"] == function and r["state"] not in ("stopped", "failed")
        )

    def wait_scaled_to_zero(self, function: str, timeout_s: float = 120.0) -> None:
        wait_for(
            lambda: self.live_replicas(function) == 0, f"{function} to scale to zero", timeout_s
        )

    def pool_idle(self) -> dict[str, int]:
        """Idle pool processes per live worker, from ``/metrics`` (``thaw_worker_pool_idle``);
        only workers that report it appear."""
        live = {w["id"] for w in self.workers() if not w["lost"]}
        with self.client() as c:
            text = c.get("/metrics").text
        out = {}
        for m in _POOL_IDLE.finditer(text):
            if m.group(1) in live:
                out[m.group(1)] = int(float(m.group(2)))
        return out

    def wait_pool_ready(self, refill_s: float, pool_size: int = 1) -> None:
        """Until the worker's pool holds ``pool_size`` idle processes again, when the worker
        reports it; otherwise for a fixed ``refill_s`` (long enough for a generic process
        to start; a cold start that still misses the pool is retried by the caller)."""
        if self.pool_idle():
            wait_for(
                lambda: min(self.pool_idle().values(), default=0) >= pool_size,
                "the worker pool to refill",
            )
            return
        time.sleep(refill_s)

    def invoke(self, function: str, body: dict[str, Any]) -> httpx.Response:
        return self.timed_invoke(function, body)[0]

    def timed_invoke(self, function: str, body: dict[str, Any]) -> tuple[httpx.Response, float]:
        """The response and the seconds from sending the request to reading the answer.
        The client is made before the clock starts (an httpx client builds an SSL
        context, ~20 ms, that a caller pays once); the connection is a new one."""
        with self.client(timeout_s=600) as c:
            started = time.perf_counter()
            r = c.post(f"/v1/functions/{function}/invoke", json=body)
            seconds = time.perf_counter() - started
        if r.status_code != 200:
            raise RuntimeError(f"invoke {function}: {r.status_code} {r.text[:500]}\n{self.logs()}")
        return r, seconds


@contextmanager
def running(root: Path, store: str, worker_env: dict[str, str]) -> Iterator[BenchStack]:
    """A server and one worker (with ``worker_env``) on SQLite + the filesystem broker."""
    root.mkdir(parents=True, exist_ok=True)
    backend = Backend("embedded", f"sqlite:///{root / 'thaw.db'}", None)
    extra = {"THAW_STORE": store, **worker_env}
    stack = BenchStack(root, backend, Path(store), extra_env=extra)
    try:
        stack.start_server()
        stack.start_worker("w1")
        yield stack
    finally:
        stack.stop()


def s3_env(endpoint_url: str) -> dict[str, str]:
    return {
        "THAW_S3_ENDPOINT_URL": endpoint_url,
        "THAW_S3_REGION": S3_REGION,
        "THAW_S3_ACCESS_KEY_ID": S3_KEYS["aws_access_key_id"],
        "THAW_S3_SECRET_ACCESS_KEY": S3_KEYS["aws_secret_access_key"],
    }


def create_thaw_bucket(endpoint_url: str) -> str:
    s3_client(endpoint_url).create_bucket(Bucket=THAW_BUCKET)
    return f"s3://{THAW_BUCKET}/store"


def scratch_dir(data_dir: Path) -> Path:
    path = data_dir / f"coldstart-run-{os.getpid()}"
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path
