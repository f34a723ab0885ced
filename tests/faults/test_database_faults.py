"""The database under faults (item 6): a private PostgreSQL cluster restarted
mid-traffic (the machine's own is shared and never touched), and many
concurrent writers on the SQLite default."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import E2EStore
from tests.e2e.stack import Backend, free_port
from tests.faults.conftest import LIGHT_ENV, FaultStack, chaos_spec, fault_stack, invoke
from tests.faults.harness import Prober, check_ledger, statuses

pytestmark = pytest.mark.slow
PG_BIN = Path("/usr/lib/postgresql/15/bin")


class PrivatePostgres:
    """A throwaway cluster (as the ``postgres`` user when the tests run as root)."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="thaw-faults-pg-"))
        self.data = self.root / "data"
        self.port = free_port()

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/thaw"

    def _run(self, *args: str) -> None:
        as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run([*as_postgres, *args], check=True, capture_output=True)

    def start(self) -> None:
        if os.geteuid() == 0:  # initdb refuses root: the cluster belongs to postgres
            shutil.chown(self.root, "postgres")
            self.root.chmod(0o755)
        self._run(str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust")
        self.pg_ctl("start")
        self._run(str(PG_BIN / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "thaw")

    def pg_ctl(self, action: str, *extra: str) -> None:
        opts = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1"
        log = str(self.root / "pg.log")
        self._run(str(PG_BIN / "pg_ctl"), action, "-D", str(self.data), "-w", "-l", log,
                  "-o", opts, *extra)  # fmt: skip

    def remove(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):  # not running
            self.pg_ctl("stop", "-m", "immediate")
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def private_pg() -> Iterator[PrivatePostgres]:
    if not (PG_BIN / "initdb").exists():
        pytest.skip(f"no PostgreSQL binaries at {PG_BIN}")
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        pytest.skip("running as root without runuser: initdb refuses root")
    pg = PrivatePostgres()
    try:
        pg.start()
        yield pg
    finally:
        pg.remove()


def test_postgres_restart_mid_traffic(
    tmp_path: Path, chaos_store: E2EStore, private_pg: PrivatePostgres
) -> None:
    be = Backend("private-postgres", private_pg.url, None)
    stack = FaultStack(tmp_path / "stack", be, chaos_store.root, extra_env=dict(LIGHT_ENV))
    try:
        stack.start_server()
        stack.add_worker()
        scaling = {"min_replicas": 1, "max_replicas": 1, "idle_timeout_s": 300}
        stack.deploy(chaos_spec(chaos_store, "steady", scaling=scaling))
        assert invoke(stack, "steady", {"input": "warm"}).status_code == 200
        body = {"input": {"sleep_s": 0.5}}  # some calls end while the database is away
        with Prober(stack, "steady", every_s=0.2, body=body) as prober:
            while len(prober.accepted) < 10:
                threading.Event().wait(0.2)
            private_pg.pg_ctl("restart", "-m", "fast")
            n = len(prober.accepted)
            while len(prober.accepted) < n + 10:
                threading.Event().wait(0.2)
        calls = check_ledger(stack, prober.accepted, settle_s=120)
        assert statuses(calls, prober.accepted) == {"succeeded": len(prober.accepted)}
        # A request that met the restart is refused as unavailable, to be retried.
        assert set(prober.refused) <= {"503"}, prober.refused
        assert prober.missing_retry_after == 0
    finally:
        stack.stop()


def test_sqlite_many_concurrent_writers(tmp_path: Path, chaos_store: E2EStore) -> None:
    with fault_stack("embedded", tmp_path, chaos_store, workers=1) as stack:
        scaling = {"min_replicas": 1, "max_replicas": 2, "target_concurrency": 8}
        stack.deploy(chaos_spec(chaos_store, "busy-db", scaling=scaling))
        assert invoke(stack, "busy-db", {"input": "warm"}).status_code == 200
        codes: Counter[int] = Counter()
        locked: list[str] = []
        accepted: list[str] = []

        def writer(w: int) -> None:
            for i in range(8):
                prefer = {"Prefer": "respond-async"} if i % 2 else {}
                r = invoke(stack, "busy-db", {"input": {"w": w, "i": i}}, **prefer)
                codes[r.status_code] += 1
                if "locked" in r.text:
                    locked.append(r.text)
                if "X-Thaw-Call-Id" in r.headers:
                    accepted.append(r.headers["X-Thaw-Call-Id"])

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not locked, locked[:3]
        assert set(codes) <= {200, 202}, codes
        calls = check_ledger(stack, accepted)
        assert statuses(calls, accepted) == {"succeeded": 12 * 8}
        assert "database is locked" not in (stack.root / "server.log").read_text()
