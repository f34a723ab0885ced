"""The broker stopped for 30 s under load (item 5), on PostgreSQL and a private
Redis this test runs (the machine's Redis is shared: it is never stopped).

Calls accepted while the broker is down are kept in the database and
dispatched once it is back; the worker reconnects by itself; no accepted call
goes missing, and any refusal is a 503 with ``Retry-After``.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest
import redis

from tests.control_plane.databases import fresh_pg_database, pg_available
from tests.e2e.conftest import E2EStore
from tests.e2e.stack import Backend, free_port, wait_for
from tests.faults.conftest import LIGHT_ENV, FaultStack, chaos_spec, invoke, proc_named
from tests.faults.harness import Prober, check_ledger, statuses

pytestmark = pytest.mark.slow
BROKER_DOWN_S = 30.0


class PrivateRedis:
    """A redis-server of this test's own, durable (append-only, fsync always), so a
    SIGKILL loses no message it acknowledged."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        args = ["--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.root)]
        args += ["--appendonly", "yes", "--appendfsync", "always", "--save", ""]
        self._log = open(self.root / "redis.log", "ab")  # noqa: SIM115 (closed by kill)
        self.proc = subprocess.Popen(["redis-server", *args], stdout=self._log, stderr=self._log)
        client = redis.Redis(port=self.port)
        wait_for(lambda: _pings(client), "the private redis-server", 30)
        client.close()

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        if self._log is not None:
            self._log.close()


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    server = PrivateRedis(tmp_path / "redis")
    server.start()
    yield server
    if server.proc is not None and server.proc.poll() is None:
        server.kill()


def test_broker_down_under_load(
    tmp_path: Path, chaos_store: E2EStore, private_redis: PrivateRedis
) -> None:
    if not pg_available():
        pytest.skip("PostgreSQL at 127.0.0.1:5432 is not reachable")
    with fresh_pg_database() as db_url:
        be = Backend("postgres-private-redis", db_url, private_redis.url)
        stack = FaultStack(tmp_path / "stack", be, chaos_store.root, extra_env=dict(LIGHT_ENV))
        try:
            stack.start_server()
            stack.add_worker()
            _under_load(stack, chaos_store, private_redis)
        finally:
            stack.stop()


def _under_load(stack: FaultStack, store: E2EStore, broker: PrivateRedis) -> None:
    scaling = {"min_replicas": 1, "max_replicas": 1, "idle_timeout_s": 300}
    stack.deploy(chaos_spec(store, "steady", timeout_s=180, scaling=scaling))
    assert invoke(stack, "steady", {"input": "warm"}).status_code == 200
    with Prober(stack, "steady", every_s=0.25) as prober:
        wait_for(lambda: len(prober.accepted) >= 5, "calls before the outage", 30)
        broker.kill()
        before = len(prober.accepted)
        time.sleep(BROKER_DOWN_S)  # the prober keeps sending throughout
        during = len(prober.accepted) - before
        broker.start()  # same data directory: what it had acknowledged is back
        after = len(prober.accepted)
        wait_for(lambda: len(prober.accepted) >= after + 5, "calls after the outage", 60)
    calls = check_ledger(stack, prober.accepted, settle_s=150)
    assert statuses(calls, prober.accepted) == {"succeeded": len(prober.accepted)}, statuses(
        calls, prober.accepted
    )
    assert during > 0, f"no call was accepted while the broker was down: {prober.refused}"
    assert prober.missing_retry_after == 0
    assert set(prober.refused) <= {"503"}, prober.refused
    assert proc_named(stack, "w1").popen.poll() is None  # the worker reconnected by itself
    assert not any(w["lost"] for w in stack.workers())
