"""The control-plane commands, end to end: a real ``thaw server`` process, and the
client commands against a served app with a fake worker."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from cli.main import app
from tests.control_plane.conftest import ControlPlane

runner = CliRunner()


def _env(cp: ControlPlane, token: str | None = None) -> dict[str, str]:
    return {
        "THAW_SERVER_URL": cp.base_url,
        "THAW_API_KEY": token or cp.admin_token,
        "THAW_STORE": str(cp.store.root),
        "THAW_HOME": str(cp.settings.home),
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_server(home: Path, port: int) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "THAW_HOME": str(home), "THAW_SERVER_PORT": str(port)}
    env["THAW_ADMIN_KEY_FILE"] = str(home / "admin.key")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from cli.main import app; app()",
            "server",
            "--log-level",
            "WARNING",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
            break
        except httpx.HTTPError:
            if proc.poll() is not None:
                raise AssertionError(proc.stdout.read() if proc.stdout else "exited") from None
            time.sleep(0.1)
    return proc, f"http://127.0.0.1:{port}"


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.terminate()
    output, _ = proc.communicate(timeout=20)
    return output


def test_thaw_server_prints_first_admin_key_once(tmp_path: Path) -> None:
    home = tmp_path / "home"
    proc, url = _run_server(home, _free_port())
    output = _stop(proc)
    token = next(line for line in output.splitlines() if line.startswith("thaw_"))
    assert (home / "admin.key").read_text().strip() == token
    assert oct((home / "admin.key").stat().st_mode & 0o777) == "0o600"
    proc, url = _run_server(home, _free_port())
    try:
        r = httpx.get(url + "/v1/keys", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200 and len(r.json()) == 1
    finally:
        second = _stop(proc)
    assert "thaw_" not in second


@pytest.fixture
def code_dir(tmp_path: Path, cp: ControlPlane) -> Path:
    d = tmp_path / "code"
    d.mkdir()
    (d / "app.py").write_text(
        "class Echo:\n    def __call__(self, input, ctx=None):\n        return input\n"
    )
    (d / "thaw.toml").write_text(
        f'name = "hello"\nentry = "app:Echo"\nmodel = "{cp.store.model_ref}"\ndevice = "cpu"\n'
        "[scaling]\nmax_replicas = 1\n"
    )
    return d


def test_deploy_invoke_show_rollback_rm(cp: ControlPlane, code_dir: Path) -> None:
    cp.worker()
    env = _env(cp)
    r = runner.invoke(app, ["deploy", str(code_dir)], env=env)
    assert r.exit_code == 0, r.output
    assert "deployed hello version 1" in r.output
    # Changed code makes version 2 (the same code again would keep version 1).
    (code_dir / "app.py").write_text((code_dir / "app.py").read_text() + "# v2\n")
    r = runner.invoke(app, ["deploy", str(code_dir)], env=env)
    assert r.exit_code == 0 and "version 2" in r.output, r.output
    r = runner.invoke(app, ["functions", "ls"], env=env)
    assert "hello" in r.output
    r = runner.invoke(app, ["invoke", "hello", "--data", '{"a": 1}'], env=env)
    assert r.exit_code == 0, r.output
    assert '"echo"' in r.output and "cold=true" in r.output
    r = runner.invoke(app, ["invoke", "hello", "--data", '{"chunks": 2}', "--stream"], env=env)
    assert r.exit_code == 0 and r.output.count('"i"') == 2
    r = runner.invoke(app, ["invoke", "hello", "--data", "1", "--async"], env=env)
    call_id = r.output.strip()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        r = runner.invoke(app, ["calls", "show", call_id], env=env)
        if '"succeeded"' in r.output:
            break
        time.sleep(0.05)
    assert '"succeeded"' in r.output
    r = runner.invoke(app, ["functions", "rollback", "hello"], env=env)
    assert "serves version 1" in r.output
    assert runner.invoke(app, ["functions", "rm", "hello"], env=env).exit_code == 0
    r = runner.invoke(app, ["functions", "show", "hello"], env=env)
    assert r.exit_code == 2 and "404" in r.output


def test_deploy_llm_writes_the_spec_and_refuses_what_goes_without_it(
    cp: ControlPlane, tmp_path: Path
) -> None:
    env = _env(cp)
    adapter = cp.store.adapter_refs[0]
    args = ["deploy", "--llm", cp.store.model_ref, "chat", "--max-num-seqs", "4"]
    r = runner.invoke(app, [*args, "--kv-cache-mb", "8", "--adapter", f"fr={adapter}"], env=env)
    assert r.exit_code == 0, r.output
    assert "deployed chat version 1" in r.output and "/openai/v1" in r.output
    fn = httpx.get(
        f"{cp.base_url}/v1/functions/chat", headers={"Authorization": f"Bearer {cp.admin_token}"}
    ).json()
    spec = fn["spec"]
    assert spec["entry"] == "worker.llm.function:LLMFunction"
    assert (spec["llm"]["max_num_seqs"], spec["llm"]["kv_cache_mb"]) == (4, 8)
    assert spec["scaling"]["target_concurrency"] == 4  # a replica takes a full batch
    assert [a["name"] for a in spec["adapters"]] == ["fr"]
    for bad, said in [
        (["deploy", str(tmp_path), "--kv-cache-mb", "8"], "--kv-cache-mb go with --llm"),
        (["deploy", str(tmp_path / "nope")], "is not a directory"),
        ([*args, "--adapter", "fr"], "--adapter takes NAME=REF"),
        ([*args, "--dtype", "int3"], "dtype"),
        (["deploy", "--llm", "missing:v9", "chat"], "missing:v9"),
    ]:
        r = runner.invoke(app, bad, env=env)
        assert r.exit_code != 0 and said in r.output, (bad, r.output)


def test_calls_show_prints_an_llm_calls_tokens(cp: ControlPlane, code_dir: Path) -> None:
    cp.worker()
    env = _env(cp)
    assert runner.invoke(app, ["deploy", str(code_dir)], env=env).exit_code == 0
    shown: dict[str, str] = {}
    for data in ('{"tokens": [12, 30]}', '{"tokens": [7, 2], "fail": "boom"}', "{}"):
        r = runner.invoke(app, ["invoke", "hello", "--data", data, "--async"], env=env)
        call_id = r.output.strip()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            r = runner.invoke(app, ["calls", "show", call_id], env=env)
            if '"succeeded"' in r.output or '"failed"' in r.output:
                break
            time.sleep(0.05)
        assert r.exit_code == 0, r.output
        shown[data] = r.output
    llm = shown['{"tokens": [12, 30]}']
    assert '"prompt_tokens": 12' in llm and '"completion_tokens": 30' in llm
    assert llm.rstrip().endswith("tokens: 12 prompt, 30 completion")
    assert "tokens: 7 prompt, 2 completion" in shown['{"tokens": [7, 2], "fail": "boom"}']
    assert '"usage": null' in shown["{}"] and "tokens:" not in shown["{}"]


def test_calls_commands_show_a_key_only_its_own_calls(cp: ControlPlane, code_dir: Path) -> None:
    cp.worker()
    assert runner.invoke(app, ["deploy", str(code_dir)], env=_env(cp)).exit_code == 0
    owner, other = _env(cp, cp.key("invoke")), _env(cp, cp.key("invoke"))
    r = runner.invoke(app, ["invoke", "hello", "--data", '{"sleep_s": 5}', "--async"], env=owner)
    call_id = r.output.strip()
    assert call_id in runner.invoke(app, ["calls", "ls"], env=owner).output
    assert (
        call_id in runner.invoke(app, ["calls", "ls", "--function", "hello"], env=_env(cp)).output
    )
    assert call_id not in runner.invoke(app, ["calls", "ls"], env=other).output
    for command in ("show", "cancel"):
        r = runner.invoke(app, ["calls", command, call_id], env=other)
        assert r.exit_code == 2
        assert r.output.strip() == f"error: 404: no call '{call_id}'"
    r = runner.invoke(app, ["calls", "cancel", call_id], env=owner)
    assert r.exit_code == 0 and '"cancelled"' in r.output


def test_keys_commands_and_errors(cp: ControlPlane, tmp_path: Path) -> None:
    env = _env(cp)
    r = runner.invoke(app, ["keys", "create", "--scope", "invoke", "--name", "ci"], env=env)
    assert r.exit_code == 0, r.output
    token = next(line for line in r.output.splitlines() if line.startswith("thaw_"))
    key_id = token.split("_")[1]
    assert key_id in runner.invoke(app, ["keys", "ls"], env=env).output
    r = runner.invoke(app, ["keys", "ls"], env=_env(cp, token))
    assert r.exit_code == 2 and "403" in r.output
    assert runner.invoke(app, ["keys", "revoke", key_id], env=env).exit_code == 0
    r = runner.invoke(app, ["invoke", "x"], env=_env(cp, token))
    assert r.exit_code == 2 and "401" in r.output
    r = runner.invoke(app, ["invoke", "x", "--data", "{bad"], env=env)
    assert r.exit_code == 2 and "not JSON" in r.output
    r = runner.invoke(app, ["deploy", str(tmp_path)], env=env)
    assert r.exit_code == 2 and "thaw.toml" in r.output


TRACEBACK = 'ValueError: bad input\n  File "app.py", line 3, in __call__\n    raise ValueError'


def test_failed_call_prints_its_message_traceback_and_id(cp: ControlPlane, code_dir: Path) -> None:
    cp.worker()
    env = _env(cp)
    assert runner.invoke(app, ["deploy", str(code_dir)], env=env).exit_code == 0
    data = json.dumps({"fail": TRACEBACK})
    for extra in ([], ["--stream"]):
        r = runner.invoke(app, ["invoke", "hello", "--data", data, *extra], env=env)
        assert r.exit_code == 2, r.output
        lines = r.output.splitlines()
        assert lines[0] == "error: call failed: ValueError: bad input", r.output
        # The traceback as lines, not a JSON string with escaped newlines.
        assert '  File "app.py", line 3, in __call__' in lines, r.output
        assert "\\n" not in r.output
        assert re.search(r"^call [0-9a-f]{32} cold=(true|false) .*total;dur=", r.output, re.M)

    r = runner.invoke(app, ["invoke", "hello", "--data", '{"chunks": 2}', "--stream"], env=env)
    assert r.exit_code == 0, r.output
    assert r.output.count('"i"') == 2
    last = r.output.strip().splitlines()[-1]
    assert re.match(r"call [0-9a-f]{32} cold=false .*total;dur=", last), r.output


def test_workers_ls_shows_health_devices_and_replicas(cp: ControlPlane, code_dir: Path) -> None:
    worker = cp.worker()
    env = _env(cp)
    assert runner.invoke(app, ["deploy", str(code_dir)], env=env).exit_code == 0
    assert runner.invoke(app, ["invoke", "hello", "--data", "1"], env=env).exit_code == 0
    r = runner.invoke(app, ["workers", "ls"], env={**env, "COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    [row] = [line for line in r.output.splitlines() if worker.id[:12] in line]
    assert "healthy" in row and "hello v1: 1 ready" in row, r.output
    r = runner.invoke(app, ["workers", "ls", "--json"], env=env)
    assert [w["id"] for w in json.loads(r.output)] == [worker.id]
    r = runner.invoke(app, ["workers", "ls"], env=_env(cp, cp.key("invoke")))
    assert r.exit_code == 2 and "403" in r.output


def test_functions_ls_and_show_give_replicas_calls_and_latency(
    cp: ControlPlane, code_dir: Path
) -> None:
    cp.worker()
    env = {**_env(cp), "COLUMNS": "250"}
    assert runner.invoke(app, ["deploy", str(code_dir)], env=env).exit_code == 0
    for i in range(3):
        assert runner.invoke(app, ["invoke", "hello", "--data", str(i)], env=env).exit_code == 0
    r = runner.invoke(app, ["functions", "ls"], env=env)
    assert r.exit_code == 0, r.output
    [row] = [line for line in r.output.splitlines() if "hello" in line]
    assert "1 ready" in row and "3 (0 failed)" in row and " ms / " in row, r.output
    r = runner.invoke(app, ["functions", "show", "hello"], env=env)
    assert r.exit_code == 0, r.output
    assert re.search(r"replicas: 1 ready; calls: 3 \(0 failed\); warm p50 [\d.]+ ms", r.output)
    r = runner.invoke(app, ["functions", "ls"], env={**env, "THAW_API_KEY": cp.key("invoke")})
    assert r.exit_code == 2 and "403" in r.output, r.output  # listing needs deploy


def test_every_command_has_help_text() -> None:
    import typer.main

    def walk(command: Any, path: str) -> Iterator[tuple[str, Any]]:
        yield path, command
        for name, sub in getattr(command, "commands", {}).items():
            yield from walk(sub, f"{path} {name}")

    missing = [
        path
        for path, command in walk(typer.main.get_command(app), "thaw")
        if not (command.help or "").strip()
    ]
    assert not missing, f"commands without help text: {missing}"
