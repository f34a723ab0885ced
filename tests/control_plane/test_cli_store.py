"""The CLI and the server agree about the store (issue #25): a real ``thaw server``
started with the relative default store (``./.thaw/store`` in its directory), and
the real CLI run from another directory with only THAW_SERVER_URL and
THAW_API_KEY set: the push lands where the server reads and the deploy works;
a model that is not there is refused naming the store that was checked."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parents[2]
APP_CODE = "class Echo:\n    def __call__(self, input, ctx=None):\n        return input\n"


def _bare_env(**extra: str) -> dict[str, str]:
    """This process's environment without any thaw, AWS or S3 setting of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("THAW_", "AWS_", "BOTO"))}
    return {**env, "PYTHONPATH": str(REPO_ROOT), **extra}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def _server(cwd: Path, **settings: str) -> Iterator[tuple[str, str]]:
    """``thaw server`` in ``cwd`` with the default home; yields (URL, admin key)."""
    cwd.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    env = _bare_env(THAW_SERVER_PORT=str(port), THAW_ADMIN_KEY_FILE="admin.key", **settings)
    args = [sys.executable, "-m", "cli.main", "server", "--log-level", "WARNING"]
    proc = subprocess.Popen(
        args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{url}/healthz", timeout=1)
                break
            except httpx.HTTPError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(proc.stdout.read() if proc.stdout else "") from None
                time.sleep(0.1)
        yield url, (cwd / "admin.key").read_text().strip()
    finally:
        proc.terminate()
        proc.communicate(timeout=20)


def _thaw(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _function(directory: Path, model: str) -> Path:
    directory.mkdir(parents=True)
    (directory / "app.py").write_text(APP_CODE)
    (directory / "thaw.toml").write_text(
        f'name = "echo"\nentry = "app:Echo"\nmodel = "{model}"\ndevice = "cpu"\n'
    )
    return directory


def test_a_push_from_another_directory_lands_where_the_server_reads(
    tmp_path: Path, llama_dir: Path
) -> None:
    server_dir, elsewhere = tmp_path / "server", tmp_path / "elsewhere"
    elsewhere.mkdir()
    with _server(server_dir) as (url, key):
        env = _bare_env(THAW_SERVER_URL=url, THAW_API_KEY=key)
        store = (server_dir / ".thaw" / "store").resolve()
        r = httpx.get(f"{url}/v1/store", headers={"Authorization": f"Bearer {key}"})
        assert r.json() == {"url": str(store), "s3_endpoint_url": None, "s3_region": None}
        assert httpx.get(f"{url}/v1/store").status_code == 401

        done = _thaw(elsewhere, env, "models", "push", str(llama_dir), "tinybert:v1")
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"pushed tinybert:v1 (model) to {store}" in done.stdout
        assert not (elsewhere / ".thaw").exists()
        assert "tinybert:v1" in _thaw(elsewhere, env, "models", "ls").stdout

        _function(elsewhere / "fn", "tinybert:v1")
        done = _thaw(elsewhere, env, "deploy", "fn")
        assert done.returncode == 0, done.stdout + done.stderr
        assert "deployed echo version 1" in done.stdout

        _function(elsewhere / "other", "absent:v1")
        done = _thaw(elsewhere, env, "deploy", "other")
        assert done.returncode == 2
        assert done.stderr.strip() == (
            f"error: 400: model absent:v1 is not in the store {store} (the control plane's); "
            f"push it there with `thaw models push DIR absent:v1 --store {store}`"
        )
        # Told otherwise, the CLI uses what it is told.
        own = tmp_path / "own-store"
        done = _thaw(elsewhere, {**env, "THAW_STORE": str(own)}, "models", "ls")
        assert done.returncode == 0 and f"no artifacts in {own}" in done.stdout


def test_a_server_store_the_cli_cannot_use_is_one_line(tmp_path: Path) -> None:
    s3 = {"THAW_STORE": "s3://thaw-bucket/models", "THAW_S3_ENDPOINT_URL": "http://127.0.0.1:9"}
    with _server(tmp_path / "server", **s3) as (url, key):
        r = httpx.get(f"{url}/v1/store", headers={"Authorization": f"Bearer {key}"})
        assert r.json()["s3_endpoint_url"] == "http://127.0.0.1:9"
        env = _bare_env(THAW_SERVER_URL=url, THAW_API_KEY=key, HOME=str(tmp_path))
        done = _thaw(tmp_path, env, "models", "ls")
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.strip() == (
        "error: the control plane's store is s3://thaw-bucket/models, and this CLI has no S3 "
        "keys for it: set THAW_S3_ACCESS_KEY_ID and THAW_S3_SECRET_ACCESS_KEY; pass --store or "
        "set THAW_STORE to a store the control plane reads"
    )


def test_a_server_url_without_a_key_says_what_to_set(tmp_path: Path) -> None:
    env = _bare_env(THAW_SERVER_URL="http://127.0.0.1:9")
    done = _thaw(tmp_path, env, "models", "ls")
    assert done.returncode == 2 and "THAW_API_KEY is not set" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
