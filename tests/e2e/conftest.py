"""End-to-end fixtures: a shared store (tiny Llama, an adapter, the test bundle) and
real installations on each database + broker combination."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from snapshotter.manifest import ArtifactKind
from snapshotter.push import push_directory
from snapshotter.registry import Registry
from snapshotter.stores import LocalStore
from tests.control_plane.databases import fresh_pg_database, pg_available
from tests.e2e.stack import Backend, Stack, reachable

FUNCTIONS = Path(__file__).parent / "functions"
REDIS = ("127.0.0.1", 6379)
RABBITMQ = ("127.0.0.1", 5672)


@dataclass(frozen=True)
class E2EStore:
    root: Path
    bundle: str
    model: str = "llama-tiny:v1"
    adapter: str = "lora0:v1"


@pytest.fixture(scope="session")
def e2e_store(
    tmp_path_factory: pytest.TempPathFactory, llama_dir: Path, adapter_dirs: list[Path]
) -> E2EStore:
    root = tmp_path_factory.mktemp("e2e-store") / "store"
    registry = Registry(LocalStore(root))
    push_directory(llama_dir, "llama-tiny:v1", registry)
    push_directory(adapter_dirs[0], "lora0:v1", registry)
    bundle = push_directory(FUNCTIONS, "bundles/e2e:v1", registry, kind=ArtifactKind.BUNDLE)
    return E2EStore(root=root, bundle=bundle.digest)


@contextmanager
def backend(name: str, tmp: Path) -> Iterator[Backend]:
    """The database and broker of one combination; skips when a server is missing."""
    if name == "embedded":
        yield Backend(name, f"sqlite:///{tmp / 'thaw.db'}", None)
        return
    if not pg_available():
        pytest.skip("PostgreSQL at 127.0.0.1:5432 is not reachable")
    broker_addr = REDIS if name == "postgres-redis" else RABBITMQ
    if not reachable(broker_addr):
        pytest.skip(f"{name}: nothing listens on {broker_addr[0]}:{broker_addr[1]}")
    # Redis: a database number of its own; RabbitMQ: queue names carry the worker id.
    broker = (
        f"redis://127.0.0.1:6379/{random.randint(8, 15)}"
        if name == "postgres-redis"
        else "amqp://guest:guest@127.0.0.1:5672//"
    )
    with fresh_pg_database() as url:
        yield Backend(name, url, broker)


@contextmanager
def running_stack(
    name: str,
    tmp: Path,
    store: E2EStore,
    workers: int = 1,
    settings: dict[str, str] | None = None,
) -> Iterator[Stack]:
    with backend(name, tmp) as be:
        stack = Stack(tmp / "stack", be, store.root, settings=settings or {})
        try:
            stack.start_server()
            for i in range(workers):
                stack.start_worker(f"w{i + 1}")
            yield stack
        finally:
            stack.stop()
