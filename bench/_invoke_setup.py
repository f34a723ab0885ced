"""What the invoke bench sets up (untimed): a no-op bundle, a store, thaw itself.

thaw runs as in production: ``thaw server`` and one ``thaw worker`` as separate
OS processes, configured only through ``THAW_*`` variables (the end-to-end
tests' ``Stack``). Two backends:

* ``filesystem``: SQLite + the embedded filesystem broker (``thaw up``);
* ``redis``: PostgreSQL at 127.0.0.1:5432 (a fresh database) + Redis at
  127.0.0.1:6379 (a database number of its own).
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from email.message import Message
from json import dumps as json_dumps
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from bench._common import PRODUCTION_ENV
from tests.e2e.stack import Backend, Stack, reachable

FUNCTION = "noop"
BUNDLE_REF = "bundles/bench-noop:v1"
REDIS_ADDR = ("127.0.0.1", 6379)
PG_ADDR = ("127.0.0.1", 5432)
BROKERS = ("filesystem", "redis")

# The function under test: returns its input. The bench also imports this very
# file to call the same function object in-process (the baseline).
NOOP_SOURCE = '''"""A no-op function: the invoke bench measures thaw's overhead around it."""

from typing import Any


class Echo:
    def __call__(self, input: Any) -> Any:
        return input
'''


class SetupError(RuntimeError):
    """The bench could not set thaw up; the message says what is missing."""


def write_bundle(bundle_dir: Path) -> Path:
    """Write the no-op bundle (``app.py``) into ``bundle_dir``; return the directory."""
    bundle_dir.mkdir(parents=True, exist_ok=True)
    (bundle_dir / "app.py").write_text(NOOP_SOURCE)
    return bundle_dir


def load_in_process(bundle_dir: Path) -> Callable[[Any], Any]:
    """The same function object the replica runs, imported into this process."""
    spec = importlib.util.spec_from_file_location("bench_noop_app", bundle_dir / "app.py")
    if spec is None or spec.loader is None:
        raise SetupError(f"cannot import {bundle_dir / 'app.py'}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn: Callable[[Any], Any] = module.Echo()
    return fn


def push_bundle(bundle_dir: Path, store_dir: Path) -> str:
    """Push the bundle into a local store; return its manifest digest."""
    from snapshotter.manifest import ArtifactKind
    from snapshotter.push import push_directory
    from snapshotter.registry import Registry
    from snapshotter.stores import LocalStore

    registry = Registry(LocalStore(store_dir))
    return push_directory(bundle_dir, BUNDLE_REF, registry, kind=ArtifactKind.BUNDLE).digest


def function_spec(bundle: str, max_clients: int) -> dict[str, Any]:
    """One warm replica that takes every client's call at once (no scale-up: on 2 cores a
    second replica only competes for the same CPUs)."""
    return {
        "name": FUNCTION,
        "bundle": bundle,
        "entry": "app:Echo",
        "device": "cpu",
        "timeout_s": 60,
        "scaling": {
            "min_replicas": 1,
            "max_replicas": 1,
            "idle_timeout_s": 3600,
            "target_concurrency": max(1, max_clients),
        },
    }


@contextmanager
def backend(name: str, tmp: Path) -> Iterator[Backend]:
    """The database and broker for ``--broker NAME``; raises SetupError when one is down."""
    if name == "filesystem":
        yield Backend(name, f"sqlite:///{tmp / 'thaw.db'}", None)
        return
    if name != "redis":
        raise SetupError(f"unknown broker {name!r}: use one of {', '.join(BROKERS)}")
    for addr, what in ((PG_ADDR, "PostgreSQL"), (REDIS_ADDR, "Redis")):
        if not reachable(addr):
            raise SetupError(f"--broker redis needs {what} at {addr[0]}:{addr[1]}; start it")
    from tests.control_plane.databases import fresh_pg_database

    with fresh_pg_database() as url:
        yield Backend(name, url, f"redis://127.0.0.1:6379/{random.randint(8, 15)}")


@contextmanager
def running(tmp: Path, broker: str, store_dir: Path, processes: int = 1) -> Iterator[Stack]:
    """A server of ``processes`` processes and one worker on the chosen backend, with
    ``PRODUCTION_ENV``; stopped on exit."""
    settings = {**PRODUCTION_ENV, "THAW_SERVER_PROCESSES": str(processes)}
    with backend(broker, tmp) as be:
        stack = Stack(tmp / "stack", be, store_dir, heartbeat_interval_s=5.0, settings=settings)
        try:
            stack.start_server()
            stack.start_worker("w1")
            yield stack
        finally:
            stack.stop()


def warm_up(stack: Stack, calls: int = 20) -> None:
    """Invoke until the replica answers warm; raise SetupError when it never does."""
    with stack.client(timeout_s=120) as c:
        cold_flags = []
        for i in range(calls):
            r = c.post(f"/v1/functions/{FUNCTION}/invoke", json={"input": {"warm": i}})
            if r.status_code != 200:
                raise SetupError(f"warm-up invoke: {r.status_code} {r.text[:300]}\n{stack.logs()}")
            cold_flags.append(r.headers.get("X-Thaw-Cold"))
    if cold_flags[-1] != "false":
        raise SetupError(f"the replica is still cold after {calls} calls: {cold_flags}")


CLIENTS = ("lean", "httpx")


@dataclass(frozen=True)
class LeanResponse:
    status_code: int
    headers: Message
    text: str

    def json(self) -> Any:
        return json.loads(self.text)


class LeanClient:
    """HTTP/1.1 keep-alive POSTs of JSON over one ``http.client`` connection.

    The clients share the machine (and its two cores) with thaw, so what a
    client spends per call is taken from thaw: httpx spends about 1.7 ms of CPU
    per call here, this about a tenth of that, like the C load generators
    (wrk, hey) that such benches are usually driven by.
    """

    def __init__(self, base_url: str, headers: dict[str, str], timeout_s: float) -> None:
        url = urlsplit(base_url)
        self._conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout_s)
        self._headers = {**headers, "Content-Type": "application/json"}

    def post(self, path: str, json: Any) -> LeanResponse:
        body = json_dumps(json).encode()
        try:
            self._conn.request("POST", path, body, self._headers)
            r = self._conn.getresponse()
            return LeanResponse(r.status, r.headers, r.read().decode())
        except (OSError, http.client.HTTPException):
            self._conn.close()  # the next request opens a new connection
            raise

    def __enter__(self) -> LeanClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self._conn.close()


def invoke_client(stack: Stack, kind: str = "lean") -> LeanClient | httpx.Client:
    """A keep-alive client for one bench client (one connection, reused)."""
    headers = {"Authorization": f"Bearer {stack.admin_key}"}
    if kind == "lean":
        return LeanClient(stack.url, headers, timeout_s=60.0)
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    return httpx.Client(base_url=stack.url, headers=headers, timeout=60.0, limits=limits)
