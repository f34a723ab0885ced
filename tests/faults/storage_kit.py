"""Helpers for the storage-fault tests: a store that can be held mid-operation, garbage,
the ``thaw`` CLI as a real subprocess, and checks that an artifact still pulls whole."""

from __future__ import annotations

import filecmp
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from safetensors.torch import save_file

from snapshotter import codec
from snapshotter.config import StoreConfig
from snapshotter.digest import digest_bytes
from snapshotter.leases import read_leases
from snapshotter.pull import pull, verify
from snapshotter.registry import Registry, chunk_key
from snapshotter.stores.base import ObjectInfo, Store

WAIT_S = 60.0


class GatedStore(Store):
    """A real store whose chunk reads or existence checks stop at a gate.

    After ``pass_first`` calls of ``op`` (``"get"`` or ``"exists"``) on chunk keys,
    each further call waits until ``release`` is called; ``held`` is set once a
    call is waiting. Everything else goes straight through.
    """

    def __init__(self, inner: Store, op: str, pass_first: int) -> None:
        self.inner = inner
        self.url = inner.url
        self.op = op
        self.held = threading.Event()
        self._open = threading.Event()
        self._left = pass_first
        self._lock = threading.Lock()

    def release(self) -> None:
        self._open.set()

    def _gate(self, op: str, key: str) -> None:
        if op != self.op or not key.startswith("chunks/"):
            return
        with self._lock:
            self._left -= 1
            if self._left >= 0:
                return
        self.held.set()
        if not self._open.wait(WAIT_S):
            raise TimeoutError("the test never released the gated store")

    def get(self, key: str) -> bytes:
        self._gate("get", key)
        return self.inner.get(key)

    def exists(self, key: str) -> bool:
        self._gate("exists", key)
        return self.inner.exists(key)

    def put(self, key: str, data: bytes | memoryview) -> None:
        self.inner.put(key, data)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def list(self, prefix: str) -> Iterator[str]:
        return self.inner.list(prefix)

    def list_info(self, prefix: str) -> Iterator[ObjectInfo]:
        return self.inner.list_info(prefix)


def put_garbage(registry: Registry, count: int, size_bytes: int = 512) -> set[str]:
    """``count`` unreferenced chunks; returns their store keys."""
    keys = set()
    for i in range(count):
        raw = i.to_bytes(8, "little") * (size_bytes // 8)
        digest = digest_bytes(raw)
        registry.put_chunk(digest, codec.encode(raw)[0])
        keys.add(chunk_key(digest))
    return keys


def chunk_keys(registry: Registry) -> set[str]:
    return set(registry.store.list("chunks/"))


def wait_until(predicate: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def leased_chunks(store: Store) -> set[str]:
    return {c for lease in read_leases(store) for c in lease.chunks}


def cli_env(config: StoreConfig, home: Path) -> dict[str, str]:
    """The environment a user would give ``thaw``: THAW_STORE and THAW_S3_*."""
    s3 = config.s3
    values = {
        "THAW_HOME": str(home),
        "THAW_STORE": config.url,
        "THAW_S3_ENDPOINT_URL": s3.endpoint_url or "",
        "THAW_S3_ACCESS_KEY_ID": s3.access_key_id or "",
        "THAW_S3_SECRET_ACCESS_KEY": s3.secret_access_key or "",
        "COLUMNS": "200",
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith("THAW_")}
    env.update({k: v for k, v in values.items() if v})
    return env


def thaw_popen(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    """``thaw ARGS`` as a real process (killable), output captured."""
    return subprocess.Popen(
        [sys.executable, "-m", "cli.main", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def thaw_run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def assert_pulls_whole(registry: Registry, ref: str, source: Path, dest: Path) -> None:
    """``ref`` verifies chunk by chunk and pulls into files equal to ``source``'s."""
    report = verify(ref, registry)
    assert report.ok, f"{ref}: {report.bad_chunks or report.manifest_error}"
    pull(ref, dest, registry)
    names = sorted(p.relative_to(source).as_posix() for p in source.rglob("*") if p.is_file())
    pulled = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert pulled == names
    _match, mismatch, errors = filecmp.cmpfiles(source, dest, names, shallow=False)
    assert (mismatch, errors) == ([], []), f"{ref}: differs in {mismatch + errors}"


def write_random_model(path: Path) -> Path:
    """1 MB of random weights in two shards and a config: about 250 chunks of 4 KiB."""
    path.mkdir(parents=True)
    generator = torch.Generator().manual_seed(7)
    for shard in range(2):
        tensors = {f"layer{shard}.{i}": torch.rand(64, 1024, generator=generator) for i in range(2)}
        save_file(tensors, path / f"model-{shard}.safetensors")
    (path / "config.json").write_text('{"model_type": "test"}')
    return path
