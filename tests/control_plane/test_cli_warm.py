"""``thaw warm`` against a served app with a fake worker."""

from __future__ import annotations

from typer.testing import CliRunner

from cli.main import app
from tests.control_plane.conftest import ControlPlane
from tests.control_plane.test_cli import _env

runner = CliRunner()


def test_warm_starts_replicas_and_waits_for_them(cp: ControlPlane) -> None:
    worker = cp.worker(start_delay_s=0.1)
    cp.deploy("echo")
    env = _env(cp)
    r = runner.invoke(app, ["warm", "echo", "--replicas", "2", "--wait"], env=env)
    assert r.exit_code == 0, r.output
    assert "2 live, 2 started" in r.output and "echo: 2 ready" in r.output
    starts = [t for t, _ in worker.received if t == "thaw.start_replica"]
    assert len(starts) == 2
    r = runner.invoke(app, ["warm", "echo"], env=env)
    assert r.exit_code == 0 and "2 live, 0 started" in r.output


def test_warm_errors_are_one_line(cp: ControlPlane) -> None:
    cp.deploy("echo")
    env = _env(cp)
    r = runner.invoke(app, ["warm", "echo"], env=env)  # no worker registered
    assert r.exit_code == 2 and "503" in r.output and "thaw worker" in r.output
    r = runner.invoke(app, ["warm", "echo", "--replicas", "9"], env=env)
    assert r.exit_code == 2 and "max_replicas" in r.output
    r = runner.invoke(app, ["warm", "nope"], env=env)
    assert r.exit_code == 2 and "404" in r.output
