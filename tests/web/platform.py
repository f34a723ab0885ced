"""A real thaw installation for browser tests: ``thaw server`` and ``thaw worker``
as subprocesses sharing one home (SQLite, the filesystem broker, a local store).

The processes are started and stopped by their own ids; their output goes to
log files under the home, printed when something fails to come up.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

THAW = Path(sys.executable).with_name("thaw")
START_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Platform:
    base_url: str
    admin_key: str
    home: Path

    def client(self, token: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token or self.admin_key}"}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=30)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(home: Path, store: Path, port: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("THAW_")}
    env.update(
        THAW_HOME=str(home),
        THAW_STORE=str(store),
        THAW_SERVER_PORT=str(port),
        THAW_SERVER_URL=f"http://127.0.0.1:{port}",
        THAW_ADMIN_KEY_FILE=str(home / "admin.key"),
        THAW_RECONCILE_INTERVAL_S="0.1",
        THAW_RESULT_POLL_INTERVAL_S="0.05",
        THAW_HEARTBEAT_INTERVAL_S="0.5",
        THAW_DEPLOY_VALIDATE_TIMEOUT_S="60",
        THAW_WORKER_NAME="browser-test-worker",
        THAW_WORKER_CONCURRENCY="4",
        **extra,
    )
    return env


def _spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [str(THAW), *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: only what it started
            proc.wait(5)


def _wait_for(what: str, check: object, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            if check():  # type: ignore[operator]
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not come up in {START_TIMEOUT_S} s:\n{log.read_text()[-4000:]}")


@contextmanager
def running_platform(home: Path, store: Path) -> Iterator[Platform]:
    """Start ``thaw server`` then ``thaw worker``; yield when the worker is registered."""
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    env = _env(home, store, port)
    server_log, worker_log = home / "server.log", home / "worker.log"
    server = _spawn(["server", "--port", str(port), "--log-level", "WARNING"], env, server_log)
    procs = [server]
    try:
        key_file = home / "admin.key"
        _wait_for(
            "thaw server",
            lambda: key_file.exists() and httpx.get(f"{base_url}/healthz").status_code == 200,
            server,
            server_log,
        )
        platform = Platform(base_url, key_file.read_text().strip(), home)
        with platform.client() as c:
            worker_key = c.post("/v1/keys", json={"scopes": ["worker"], "name": "worker"}).json()
        worker = _spawn(
            ["worker", "--log-level", "WARNING"],
            {**env, "THAW_API_KEY": worker_key["token"]},
            worker_log,
        )
        procs.append(worker)
        with platform.client() as c:
            _wait_for("thaw worker", lambda: c.get("/v1/workers").json(), worker, worker_log)
        yield platform
    finally:
        for p in reversed(procs):
            _stop(p)
