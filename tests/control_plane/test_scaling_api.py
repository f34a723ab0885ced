"""Scaling changes merge (issue #25): a PATCH names only what it changes, through the
API and through ``thaw functions scale``, against a served control plane."""

from __future__ import annotations

from typer.testing import CliRunner

from cli.main import app
from tests.control_plane.conftest import ControlPlane

runner = CliRunner()


def test_patch_keeps_the_fields_it_does_not_send(cp: ControlPlane) -> None:
    cp.deploy("echo", scaling={"max_replicas": 2, "idle_timeout_s": 45, "target_concurrency": 3})
    with cp.client() as c:
        r = c.patch("/v1/functions/echo/scaling", json={"max_replicas": 3})
        assert r.status_code == 200, r.text
        assert r.json()["spec"]["scaling"] == {
            "min_replicas": 0,
            "max_replicas": 3,
            "idle_timeout_s": 45.0,
            "target_concurrency": 3,
        }
        # The merged scaling is what is validated: min above the kept max is refused.
        bad = c.patch("/v1/functions/echo/scaling", json={"min_replicas": 4})
        assert bad.status_code == 422, bad.text
        assert "min_replicas (4) exceeds max_replicas (3)" in bad.json()["detail"]
        assert c.get("/v1/functions/echo").json()["spec"]["scaling"]["min_replicas"] == 0
        assert c.patch("/v1/functions/echo/scaling", json={"maximum": 1}).status_code == 422
        assert c.get("/v1/functions/echo").json()["versions"] == [1]


def test_thaw_functions_scale(cp: ControlPlane) -> None:
    cp.deploy("echo", scaling={"max_replicas": 2, "idle_timeout_s": 45})
    env = {"THAW_SERVER_URL": cp.base_url, "THAW_API_KEY": cp.admin_token}
    r = runner.invoke(app, ["functions", "scale", "echo", "--max", "4"], env=env)
    assert r.exit_code == 0, r.output
    expected = "echo version 1: min 0, max 4, idle timeout 45 s, target concurrency 1"
    assert r.output.strip() == expected
    args = ["functions", "scale", "echo", "--idle-timeout-s", "10", "--target-concurrency", "8"]
    r = runner.invoke(app, args, env=env)
    assert (
        r.output.strip() == "echo version 1: min 0, max 4, idle timeout 10 s, target concurrency 8"
    )
    r = runner.invoke(app, ["functions", "scale", "echo", "--min", "5"], env=env)
    assert r.exit_code == 2 and "exceeds max_replicas (4)" in r.output, r.output
    r = runner.invoke(app, ["functions", "scale", "echo"], env=env)
    assert r.exit_code == 2 and "nothing to change" in r.output
    r = runner.invoke(app, ["functions", "scale", "--help"], env=env)
    assert "options not given keep their current values" in r.output
    assert "--idle-timeout-s" in r.output and "--target-concurrency" in r.output
