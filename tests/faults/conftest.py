"""Fixtures of the fault suite: the chaos function's bundle in the e2e store, its
spec, and helpers to kill processes for real. Stacks come from ``tests.e2e``."""

from __future__ import annotations

import dataclasses
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from snapshotter.manifest import ArtifactKind
from snapshotter.push import push_directory
from snapshotter.registry import Registry
from snapshotter.stores import LocalStore
from tests.e2e.conftest import E2EStore, backend, e2e_store  # noqa: F401 (the fixture)
from tests.e2e.stack import Proc, Stack
from tests.faults.harness import db_value

FUNCTIONS = Path(__file__).parent / "functions"

# Worker processes in fault tests: one pre-warmed process, no heavy preloads.
LIGHT_ENV = {"THAW_WORKER_POOL_PRELOAD": ""}


@pytest.fixture(scope="session")
def chaos_store(e2e_store: E2EStore) -> E2EStore:  # noqa: F811
    """The e2e store with the chaos bundle pushed; ``bundle`` is the chaos bundle."""
    registry = Registry(LocalStore(e2e_store.root))
    bundle = push_directory(FUNCTIONS, "bundles/faults:v1", registry, kind=ArtifactKind.BUNDLE)
    return dataclasses.replace(e2e_store, bundle=bundle.digest)


@dataclasses.dataclass
class FaultStack(Stack):
    """A ``Stack`` whose processes all get ``extra_env`` (tuned for fault tests)."""

    extra_env: dict[str, str] = dataclasses.field(default_factory=dict)

    _names: int = 0

    def env(self, **extra: str) -> dict[str, str]:
        return super().env(**{**self.extra_env, **extra})

    def add_worker(self, **env: str) -> Proc:
        """Start one more worker (w<n>, a fresh name and directory) with ``env`` on top."""
        self._names += 1
        saved = dict(self.extra_env)
        self.extra_env.update(env)
        try:
            return self.start_worker(f"w{self._names}")
        finally:
            self.extra_env = saved


@contextmanager
def fault_stack(
    name: str, tmp: Path, store: E2EStore, workers: int = 1, **extra_env: str
) -> Iterator[FaultStack]:
    """A running stack on backend ``name`` with ``workers`` light workers (w1, w2, ...)."""
    with backend(name, tmp) as be:
        stack = FaultStack(tmp / "stack", be, store.root, extra_env={**LIGHT_ENV, **extra_env})
        try:
            stack.start_server()
            for _ in range(workers):
                stack.add_worker()
            yield stack
        finally:
            stack.stop()


def chaos_spec(store: E2EStore, name: str, **kw: Any) -> dict[str, Any]:
    """A ``Chaos`` function with no model (fast starts); keyword arguments override."""
    spec: dict[str, Any] = {
        "name": name,
        "bundle": store.bundle,
        "entry": "app:Chaos",
        "device": "cpu",
        "timeout_s": 60,
        "retries": 1,
        "scaling": {"min_replicas": 0, "max_replicas": 2, "idle_timeout_s": 120},
    }
    spec.update(kw)
    return spec


def invoke(stack: Stack, name: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    with stack.client() as c:
        return c.post(f"/v1/functions/{name}/invoke", json=body, headers=headers)


def invoke_async(stack: Stack, name: str, input: Any, **headers: str) -> str:
    r = invoke(stack, name, {"input": input}, Prefer="respond-async", **headers)
    assert r.status_code == 202, f"{r.status_code} {r.text}"
    return str(r.json()["call_id"])


def sigkill(proc: Proc) -> None:
    """Kill a stack process with SIGKILL (no cleanup of its own) and reap it."""
    proc.popen.send_signal(signal.SIGKILL)
    proc.popen.wait()


def proc_named(stack: Stack, name: str) -> Proc:
    [proc] = [p for p in stack.procs if p.name == name and p.popen.poll() is None]
    return proc


def worker_name_of_call(stack: Stack, call_id: str) -> str:
    """The name of the worker whose replica holds ``call_id`` (read from the database)."""
    sql = (
        "SELECT w.name FROM calls c JOIN replicas r ON r.id = c.replica_id "
        "JOIN workers w ON w.id = r.worker_id WHERE c.id = :id"
    )
    return str(db_value(stack, sql, id=call_id))


def pid_alive(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ")[-1][:1] != "Z"


def env_with(**extra: str) -> dict[str, str]:
    return {**os.environ, **extra}
