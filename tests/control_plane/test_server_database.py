"""A database the server cannot use is one line naming it (password masked) and the
fix, exit code 2 (issue #25): ``thaw server`` and ``thaw up`` as real processes,
against the local PostgreSQL."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.control_plane.databases import pg_available

PASSWORD = "not-shown-anywhere"


def _thaw(args: list[str], home: Path, db_url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "THAW_HOME": str(home), "THAW_DATABASE_URL": db_url}
    env["THAW_SERVER_PORT"] = str(_free_port())
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, done.stdout + done.stderr
    lines = (done.stdout + done.stderr).splitlines()
    assert len(lines) == 1, "\n".join(lines)
    assert PASSWORD not in lines[0]
    return lines[0]


@pytest.mark.parametrize("command", [["server"], ["up", "--port", "0"]])
def test_a_missing_database_is_one_line_with_the_fix(command: list[str], tmp_path: Path) -> None:
    if not pg_available():
        pytest.skip("PostgreSQL at 127.0.0.1:5432 is not reachable")
    name = f"thaw_missing_{uuid.uuid4().hex[:8]}"
    url = f"postgresql+psycopg://postgres:{PASSWORD}@127.0.0.1:5432/{name}"
    line = _one_line(_thaw(command, tmp_path / "home", url))
    assert line == (
        f"error: database '{name}' does not exist on the server of "
        f"postgresql+psycopg://postgres:***@127.0.0.1:5432/{name}; create it with "
        f'`createdb -h 127.0.0.1 -p 5432 -U postgres {name}` (or CREATE DATABASE "{name}";) '
        "and start again"
    )


def test_a_server_that_refuses_connections_is_one_line(tmp_path: Path) -> None:
    port = _free_port()  # nothing listens there
    url = f"postgresql+psycopg://thaw:{PASSWORD}@127.0.0.1:{port}/thaw"
    line = _one_line(_thaw(["server"], tmp_path / "home", url))
    assert line == (
        f"error: cannot connect to the database at postgresql+psycopg://thaw:***@127.0.0.1:"
        f"{port}/thaw: the server refuses connections; start it, or set THAW_DATABASE_URL "
        "to one that is running"
    )
