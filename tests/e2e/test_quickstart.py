"""The README's distributed quickstart, run as a user would: its script
(``examples/distributed/quickstart.sh``, which the README shows verbatim) on a
fresh PostgreSQL database, Redis, an S3 server and two workers, to a cold and a
warm call of the example."""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.control_plane.databases import fresh_pg_database, pg_available
from tests.e2e.stack import reachable
from tests.fixtures.s3 import moto_server

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "distributed" / "quickstart.sh"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_readme_shows_the_quickstart_script_verbatim() -> None:
    steps = SCRIPT.read_text().split("\nset -euo pipefail\n", 1)[1]
    assert steps.strip() in (ROOT / "README.md").read_text()


def test_distributed_quickstart_runs_to_a_cold_and_a_warm_call(tmp_path: Path) -> None:
    if not pg_available() or not reachable(("127.0.0.1", 6379)):
        pytest.skip("needs PostgreSQL at 127.0.0.1:5432 and Redis at 127.0.0.1:6379")
    run = tmp_path / "run"
    with fresh_pg_database() as url, moto_server() as s3:
        env = {
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
            "THAW_QUICKSTART_DIR": str(run),
            "THAW_DB_NAME": url.rsplit("/", 1)[1],  # made empty by the fixture: step 1 keeps it
            "THAW_BROKER_URL": f"redis://127.0.0.1:6379/{random.randint(8, 15)}",
            "THAW_STORE": f"s3://quickstart-{uuid.uuid4().hex[:8]}/store",
            "THAW_S3_ENDPOINT_URL": s3,
            "THAW_S3_ACCESS_KEY_ID": "test",
            "THAW_S3_SECRET_ACCESS_KEY": "test",
            "THAW_SERVER_PORT": str(_free_port()),
            "THAW_WORKER_POOL_PRELOAD": "",  # lighter workers on a 2-core machine
            "COLUMNS": "200",  # `thaw workers ls` unwrapped
        }
        for name in list(env):
            if name.startswith("THAW_") and name not in (
                "THAW_QUICKSTART_DIR",
                "THAW_DB_NAME",
                "THAW_BROKER_URL",
                "THAW_STORE",
                "THAW_S3_ENDPOINT_URL",
                "THAW_S3_ACCESS_KEY_ID",
                "THAW_S3_SECRET_ACCESS_KEY",
                "THAW_SERVER_PORT",
                "THAW_WORKER_POOL_PRELOAD",
            ):
                del env[name]  # the script alone sets up everything else
        try:
            done = subprocess.run(
                ["bash", str(SCRIPT)],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=420,
            )
            logs = "\n".join(
                f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in run.glob("*.log")
            )
            output = done.stdout + done.stderr
            assert done.returncode == 0, f"{output}\n{logs}"
            assert re.search(r"w1 .*healthy", output) and re.search(r"w2 .*healthy", output)
            calls = re.findall(r"call [0-9a-f]{32} cold=(true|false)", output)
            assert calls == ["true", "false"], output
            assert "thaw is running" in output
        finally:
            pids = run / "pids"
            for pid in pids.read_text().split() if pids.exists() else []:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGTERM)
            for pid in pids.read_text().split() if pids.exists() else []:
                _wait_gone(int(pid))


def _wait_gone(pid: int, timeout_s: float = 40.0) -> None:
    """Wait for a process the script started (not our child) to exit; SIGKILL after."""
    deadline = time.monotonic() + timeout_s
    while Path(f"/proc/{pid}").exists():
        stat = Path(f"/proc/{pid}/stat").read_text(errors="replace")
        if stat.split(") ")[-1][:1] == "Z":
            return
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            return
        time.sleep(0.2)
