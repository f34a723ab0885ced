"""The per-function gauges the alert rules join on, as /metrics exports them."""

from __future__ import annotations

from tests.control_plane.conftest import ControlPlane


def test_metrics_export_target_concurrency_and_deploy_time(cp: ControlPlane) -> None:
    cp.deploy("echo", scaling={"target_concurrency": 3})
    with cp.client() as c:
        created_at = c.get("/v1/functions/echo").json()["created_at"]
        text = c.get("/metrics").text
        assert 'thaw_function_target_concurrency{function="echo"} 3.0' in text
        line = next(
            ln for ln in text.splitlines() if ln.startswith("thaw_function_deployed_timestamp")
        )
        assert float(line.split()[-1]) >= created_at
        assert c.delete("/v1/functions/echo").status_code in (200, 204)
        text = c.get("/metrics").text
        assert 'thaw_function_target_concurrency{function="echo"}' not in text
