"""A real thaw installation for end-to-end tests: ``thaw server`` and ``thaw worker``
as separate OS processes, on a chosen database and Celery broker.

Everything the processes know comes from ``THAW_*`` variables, as in
production. Logs go to files under the stack's directory; ``logs()`` returns
their tails for assertion messages.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx

from control_plane.settings import Settings

START_TIMEOUT_S = 90.0


@dataclass(frozen=True)
class Backend:
    name: str
    database_url: str
    broker_url: str | None  # None: the embedded filesystem:// broker


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def reachable(addr: tuple[str, int]) -> bool:
    """Whether something accepts TCP connections at ``addr`` (a server the setup needs)."""
    try:
        with socket.create_connection(addr, timeout=1):
            return True
    except OSError:
        return False


def wait_for(probe: Callable[[], Any], what: str, timeout_s: float = START_TIMEOUT_S) -> Any:
    """Poll ``probe`` until it returns something truthy; fail with ``what`` on timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.1)


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    log: IO[bytes]

    def stop(self, sig: int = signal.SIGTERM, grace_s: float = 20.0) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self.log.close()


@dataclass
class Stack:
    root: Path
    backend: Backend
    store: Path
    heartbeat_interval_s: float = 0.5
    port: int = field(default_factory=free_port)
    procs: list[Proc] = field(default_factory=list)
    admin_key: str = ""
    worker_key: str = ""
    settings: dict[str, str] = field(default_factory=dict)  # more THAW_* for every process

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self, **extra: str) -> dict[str, str]:
        env = {
            **os.environ,
            "THAW_HOME": str(self.root / "home"),
            "THAW_DATABASE_URL": self.backend.database_url,
            "THAW_STORE": str(self.store),
            "THAW_SERVER_URL": self.url,
            "THAW_SERVER_PORT": str(self.port),
            "THAW_ADMIN_KEY_FILE": str(self.root / "admin.key"),
            "THAW_HEARTBEAT_INTERVAL_S": str(self.heartbeat_interval_s),
            "THAW_WORKER_LOST_AFTER_HEARTBEATS": "4",
            "THAW_RECONCILE_INTERVAL_S": "0.1",
            "THAW_RESULT_POLL_INTERVAL_S": "0.05",
            "THAW_BROKER_POLL_INTERVAL_S": "0.02",
            "THAW_DEPLOY_VALIDATE_TIMEOUT_S": "60",
            **self.settings,
            **extra,
        }
        if self.backend.broker_url:
            env["THAW_BROKER_URL"] = self.backend.broker_url
        return env

    def _spawn(self, name: str, args: list[str], env: dict[str, str]) -> Proc:
        log_path = self.root / f"{name}.log"
        log = open(log_path, "ab")  # noqa: SIM115 (closed by Proc.stop)
        popen = subprocess.Popen(
            [sys.executable, "-m", "cli.main", *args],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        proc = Proc(name, popen, log_path, log)
        self.procs.append(proc)
        return proc

    # --- processes ---------------------------------------------------------------
    def start_server(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        server = self._spawn("server", ["server", "--log-level", "WARNING"], self.env())
        wait_for(lambda: self._healthy(server), "the control plane")
        self.admin_key = (self.root / "admin.key").read_text().strip()
        with self.client() as c:
            r = c.post("/v1/keys", json={"scopes": ["worker"], "name": "e2e worker"})
            r.raise_for_status()
            self.worker_key = r.json()["token"]

    def _healthy(self, server: Proc) -> bool:
        if server.popen.poll() is not None:
            raise AssertionError(f"the server exited:\n{self.logs()}")
        try:
            return httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def start_worker(self, name: str = "w1") -> Proc:
        """Start a ``thaw worker`` with its own worker dir; wait until it is registered."""
        before = {w["id"] for w in self.workers()}
        env = self.env(
            THAW_API_KEY=self.worker_key,
            THAW_WORKER_NAME=name,
            THAW_WORKER_DIR=str(self.root / "workers" / name),
        )
        proc = self._spawn(name, ["worker", "--log-level", "WARNING"], env)

        def registered() -> bool:
            if proc.popen.poll() is not None:
                raise AssertionError(f"worker {name} exited:\n{self.logs()}")
            return any(w["id"] not in before and not w["lost"] for w in self.workers())

        wait_for(registered, f"worker {name} to register")
        return proc

    def stop(self) -> None:
        for proc in reversed(self.procs):  # workers first: they stop their replicas
            proc.stop()
        # The home's last worker to stop removes its default RAM tier; a worker killed
        # (SIGKILL, or past its stop grace) leaves it behind, as a crash would.
        shutil.rmtree(self.default_ram_tier(), ignore_errors=True)

    def default_ram_tier(self) -> Path:
        """The RAM tier the workers use unless ``settings`` sets THAW_RAM_TIER_DIR."""
        return Settings(home=self.root / "home", ram_tier_dir=None).ram_tier_config().directory

    # --- API ---------------------------------------------------------------------
    def client(self, timeout_s: float = 120.0) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.admin_key}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)

    def workers(self) -> list[dict[str, Any]]:
        with self.client() as c:
            r = c.get("/v1/workers")
            r.raise_for_status()
            return list(r.json())

    def deploy(self, spec: dict[str, Any]) -> None:
        with self.client() as c:
            r = c.post("/v1/functions", json=spec)
        assert r.status_code == 201, f"{r.status_code} {r.text}\n{self.logs()}"

    def call(self, call_id: str) -> dict[str, Any]:
        with self.client() as c:
            r = c.get(f"/v1/calls/{call_id}")
            r.raise_for_status()
            return dict(r.json())

    def logs(self, lines: int = 25) -> str:
        parts = []
        for proc in self.procs:
            text = proc.log_path.read_text(errors="replace") if proc.log_path.exists() else ""
            tail = "\n".join(text.splitlines()[-lines:])
            parts.append(f"--- {proc.name} (exit {proc.popen.poll()}) ---\n{tail}")
        return "\n".join(parts)
