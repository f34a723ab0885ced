"""``thaw loadtest`` against a served control plane with a fake worker: the JSON
agrees with what the server counted."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from tests.control_plane.conftest import ControlPlane

runner = CliRunner()


@pytest.fixture
def cp(cp_factory: Callable[..., ControlPlane]) -> ControlPlane:
    # The load shares two busy cores with the fake worker: a lost-worker window of
    # 0.6 s (3 heartbeats) would end calls as failed on a late heartbeat.
    return cp_factory(worker_lost_after_heartbeats=50)


def _env(cp: ControlPlane) -> dict[str, str]:
    return {"THAW_SERVER_URL": cp.base_url, "THAW_API_KEY": cp.admin_token}


def _server_count(cp: ControlPlane, cold: str | None = None) -> float:
    with cp.client() as c:
        text = c.get("/metrics").text
    total = 0.0
    pattern = (
        r'thaw_call_latency_seconds_count\{cold="(\w+)",function="echo",status="(\w+)"\} (\S+)'
    )
    for is_cold, status, value in re.findall(pattern, text):
        assert status == "succeeded", text
        if cold is None or is_cold == cold:
            total += float(value)
    return total


def _percentiles_ordered(q: dict[str, float]) -> bool:
    return q["p50"] <= q["p90"] <= q["p95"] <= q["p99"] <= q["max"]


def test_concurrency_run_reports_what_the_server_saw(cp: ControlPlane) -> None:
    cp.worker(start_delay_s=0.2)
    cp.deploy("echo", scaling={"min_replicas": 0, "max_replicas": 2, "target_concurrency": 4})
    args = ["loadtest", "echo", "--concurrency", "4", "--duration-s", "2", "--json"]
    result = runner.invoke(app, [*args, "--data", '{"x": 1}'], env=_env(cp))
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["concurrency"] == 4 and doc["errors"] == 0 and doc["error_examples"] == []
    assert doc["calls"] == doc["ok"] == _server_count(cp) >= 4  # each client ended one
    assert doc["cold"]["calls"] == _server_count(cp, "true") >= 1
    assert doc["warm"]["calls"] + doc["cold"]["calls"] == doc["calls"]
    assert _percentiles_ordered(doc["latency_ms"]) and _percentiles_ordered(doc["ttft_ms"])
    assert doc["throughput_per_s"] > 0
    assert sum(s["calls"] for s in doc["per_second"]) == doc["calls"]
    assert doc["queue"] and doc["queue_note"] is None  # an admin key samples /metrics
    assert doc["max_queue_depth"] is not None


def test_rate_run_sends_the_schedule_streams_and_draws(cp: ControlPlane, tmp_path: Path) -> None:
    cp.worker()
    cp.deploy("echo")
    png = tmp_path / "load.png"
    args = ["loadtest", "echo", "--rate", "10", "--arrival", "constant", "--duration-s", "1.5"]
    args += ["--stream", "--data", '{"chunks": 2}', "--json", "--png", str(png)]
    result = runner.invoke(app, args, env=_env(cp))
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["scheduled_calls"] == doc["calls"] == doc["ok"] == 15, doc["error_examples"]
    assert doc["errors"] == 0 and doc["calls"] == _server_count(cp)
    # Streamed: the first output comes before the end of every call.
    assert doc["ttft_ms"]["p50"] <= doc["latency_ms"]["p50"]
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_refuses_both_or_neither_load_shape(cp: ControlPlane) -> None:
    for extra in ([], ["--concurrency", "2", "--rate", "3"]):
        result = runner.invoke(app, ["loadtest", "echo", *extra], env=_env(cp))
        assert result.exit_code != 0
        assert "exactly one of --concurrency" in result.output
