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
from sqlalchemy import create_engine, text

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
        check_llm_lines_as_printed(output)
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


def check_llm_lines_as_printed(output: str) -> None:
    """The LLM function's curl line and openai SDK snippet, run as printed."""
    curl = next(line for line in output.splitlines() if "/openai/v1/chat/completions" in line)
    done = subprocess.run(["bash", "-c", curl], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    reply = json.loads(done.stdout)
    assert reply["object"] == "chat.completion", reply
    assert reply["usage"]["completion_tokens"] >= 1
    snippet = output[output.index("python3 - <<'EOF'") :]
    snippet = snippet[: snippet.index("\nEOF\n") + len("\nEOF\n")]
    venv_path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"  # python3 with openai
    done = subprocess.run(
        ["bash", "-c", snippet],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PATH": venv_path},
    )
    assert done.returncode == 0 and done.stdout, done.stderr  # random weights: any text


# --- faults under `thaw up` (tests/faults/README.md, items 22-24) -------------------
CHAOS_APP = Path(__file__).parents[1] / "faults" / "functions" / "app.py"


class Up:
    """A running ``thaw up`` on ``home``, its console read into ``lines``."""

    def __init__(self, home: Path, port: int) -> None:
        env = {**os.environ, "THAW_HOME": str(home), "THAW_DRAIN_GRACE_S": "60"}
        env.pop("THAW_API_KEY", None)
        self.home, self.port = home, port
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "up", "--port", str(port)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        stdout = self.proc.stdout
        assert stdout is not None
        self.reader = threading.Thread(target=lambda: self.lines.extend(iter(stdout.readline, "")))
        self.reader.start()
        wait_for(lambda: self.said("Ctrl-C stops") or self.proc.poll() is not None, "thaw up", 300)
        assert self.proc.poll() is None, self.output()
        self.key = (home / "admin.key").read_text().strip()

    def said(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    def output(self) -> str:
        return "".join(self.lines[-40:])

    def client(self) -> httpx.Client:
        return httpx.Client(
            base_url=f"http://127.0.0.1:{self.port}",
            headers={"Authorization": f"Bearer {self.key}"},
            timeout=120,
        )

    def worker_pid(self) -> int:
        started = [line for line in self.lines if line.startswith("started worker (pid ")]
        return int(started[-1].split("pid ")[1].split(",")[0])

    def stop(self, sig: int = signal.SIGINT) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout=180)
        self.reader.join(timeout=10)
        self.proc.stdout.close()  # type: ignore[union-attr]
        return code


def deploy_chaos(up: Up, tmp_path: Path) -> None:
    """``thaw deploy`` of the fault suite's ``Chaos`` function (sleeps on request)."""
    directory = tmp_path / "chaos"
    directory.mkdir()
    (directory / "app.py").write_text(CHAOS_APP.read_text())
    (directory / "thaw.toml").write_text(
        'name = "chaos"\nentry = "app:Chaos"\ndevice = "cpu"\ntimeout_s = 120\nretries = 1\n'
        "[scaling]\nmax_replicas = 1\ntarget_concurrency = 1\n"
    )
    env = {
        **os.environ,
        "THAW_HOME": str(up.home),  # the store `thaw up` uses
        "THAW_SERVER_URL": f"http://127.0.0.1:{up.port}",
        "THAW_API_KEY": up.key,
    }
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", "deploy", str(directory)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr + done.stdout


def call_statuses(home: Path) -> dict[str, str]:
    engine = create_engine(f"sqlite:///{home / 'thaw.db'}")
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT id, status FROM calls")).all()
            return {str(r[0]): str(r[1]) for r in rows}
    finally:
        engine.dispose()


def test_up_starts_a_killed_worker_again_and_drains_on_ctrl_c(tmp_path: Path) -> None:
    home = tmp_path / "home"
    up = Up(home, free_port())
    try:
        deploy_chaos(up, tmp_path)
        with up.client() as c:
            assert c.post("/v1/functions/chaos/invoke", json={"input": 1}).status_code == 200
            first_pid = up.worker_pid()
            os.kill(first_pid, signal.SIGKILL)
            wait_for(lambda: up.said("starting it again"), "thaw up to restart the worker", 60)
            assert up.proc.poll() is None, up.output()
            wait_for(lambda: up.worker_pid() != first_pid, "a new worker", 60)
            # The platform goes on serving: the next call is run by the new worker.
            r = c.post("/v1/functions/chaos/invoke", json={"input": 2})
            assert r.status_code == 200, r.text + up.output()
            # Ctrl-C with one call running and one queued behind it (one replica, one
            # call at a time): the running one finishes, the queued one waits for the next start.
            long_calls = [
                c.post(
                    "/v1/functions/chaos/invoke",
                    json={"input": {"sleep_s": 8, "i": i}},
                    headers={"Prefer": "respond-async"},
                ).json()["call_id"]
                for i in range(2)
            ]

            def status(call_id: str) -> str:
                return str(c.get(f"/v1/calls/{call_id}").json()["status"])

            wait_for(lambda: status(long_calls[0]) == "running", "the first long call to run", 90)
            assert status(long_calls[1]) == "queued"
    finally:
        code = up.stop(signal.SIGINT)
    assert code == 0, up.output()
    assert up.said("draining the worker"), up.output()
    statuses = call_statuses(home)
    assert statuses[long_calls[0]] == "succeeded", up.output()
    assert statuses[long_calls[1]] == "queued", up.output()
    # The next start runs it; then the ledger: every accepted call in exactly one final state.
    again = Up(home, free_port())
    try:
        wait_for(lambda: call_statuses(home)[long_calls[1]] == "succeeded", "the queued call", 90)
    finally:
        assert again.stop() == 0, again.output()
    assert set(call_statuses(home).values()) == {"succeeded"}, call_statuses(home)


def test_up_started_again_deploys_no_new_version(tmp_path: Path) -> None:
    home = tmp_path / "home"
    for _ in range(2):
        up = Up(home, free_port())
        try:
            with up.client() as c:
                shown = c.get("/v1/functions/textgen").json()
        finally:
            assert up.stop() == 0, up.output()
        assert shown["versions"] == [1], shown
