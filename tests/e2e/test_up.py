"""``thaw up`` on a fresh home: everything comes up, the example answers, Ctrl-C
stops every process it started (no orphans)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from tests.e2e.stack import free_port, wait_for
from tests.e2e.test_platform import pid_alive

pytestmark = pytest.mark.slow


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (children, their children, ...)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def test_up_serves_the_example_and_ctrl_c_stops_everything(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "THAW_HOME": str(tmp_path / "home")}
    env.pop("THAW_API_KEY", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "up", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")))  # type: ignore[union-attr]
    reader.start()
    try:
        wait_for(lambda: any("Ctrl-C stops" in line for line in lines), "thaw up", 300)
        output = "".join(lines)
        assert "functions run on the CPU" in output or "GPU(s)" in output, output
        assert "curl -s" in output and "text/event-stream" in output
        key = (tmp_path / "home" / "admin.key").read_text().strip()
        assert key in output
        url = f"http://127.0.0.1:{port}/v1/functions/textgen/invoke"
        headers = {"Authorization": f"Bearer {key}"}
        body = {"input": {"prompt": "The quick brown fox", "max_tokens": 8}}
        r = httpx.post(url, json=body, headers=headers, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["output"]["text"]
        stream_headers = {**headers, "Accept": "text/event-stream"}
        with httpx.stream(
            "POST", url, json={**body, "adapter": "pirate"}, headers=stream_headers, timeout=120
        ) as s:
            text = "".join(s.iter_text())
        blocks = [b.split("\n") for b in text.strip().split("\n\n")]
        assert blocks[-1][0] == "event: done" and len(blocks) > 2
        assert json.loads(blocks[-1][1].removeprefix("data: "))["adapter"] == "pirate"
        started = descendants(proc.pid)
        assert len(started) >= 3  # control plane, worker, at least one replica
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)
        reader.join(timeout=10)
        proc.stdout.close()  # type: ignore[union-attr]
    assert code == 0, "".join(lines[-30:])
    assert "thaw stopped." in "".join(lines)
    assert [pid for pid in started if pid_alive(pid)] == []
