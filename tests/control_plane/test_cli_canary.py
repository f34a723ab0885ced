"""``thaw deploy --canary`` and ``thaw canary status/promote/abort`` against a served app
with a fake worker."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from tests.control_plane.conftest import ControlPlane
from tests.control_plane.test_cli import _env, code_dir  # noqa: F401  (a fixture)

runner = CliRunner()


@pytest.fixture
def cp(cp_factory: Callable[..., ControlPlane]) -> ControlPlane:
    # Lost after 3 s without a heartbeat, not 0.6 s: these tests make many calls, and a
    # loaded CI machine can starve the fake worker's heartbeat thread that long.
    return cp_factory(heartbeat_interval_s=1.0)


def test_deploy_canary_status_table_then_promote_and_abort(
    cp: ControlPlane,
    code_dir: Path,  # noqa: F811
) -> None:
    cp.worker()
    env = _env(cp)
    assert runner.invoke(app, ["deploy", str(code_dir)], env=env).exit_code == 0
    r = runner.invoke(app, ["deploy", str(code_dir), "--canary", "50"], env=env)
    assert r.exit_code == 0, r.output
    said = " ".join(r.output.split())  # rich wraps long lines
    assert "version 2 as a canary taking 50% of calls (version 1 keeps the rest)" in said
    for i in range(6):
        r = runner.invoke(app, ["invoke", "hello", "--data", str(i)], env=env)
        assert r.exit_code == 0, r.output

    r = runner.invoke(app, ["canary", "status", "hello"], env=env)
    assert r.exit_code == 0, r.output
    assert "v1 (active)" in r.output and "v2 (canary, 50%)" in r.output
    for row in ("p50 ms", "p99 ms", "first output p95 ms", "error rate", "cold-start rate"):
        assert row in r.output

    r = runner.invoke(app, ["canary", "promote", "hello"], env=env)
    assert r.exit_code == 0 and "version 2 is now active" in r.output
    r = runner.invoke(app, ["canary", "status", "hello"], env=env)
    assert r.exit_code != 0 and "has no canary" in r.output

    assert runner.invoke(app, ["deploy", str(code_dir), "--canary", "5"], env=env).exit_code == 0
    r = runner.invoke(app, ["canary", "abort", "hello"], env=env)
    assert r.exit_code == 0 and "version 2 takes every call" in r.output
