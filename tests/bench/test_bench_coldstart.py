"""The cold-start bench runs end to end (tiny model, one trial) and reports every scenario.

No timing assertions: speed claims live in bench/README.md, not in tests.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench._coldstart_report import SCENARIOS, TARGETS, ratios, summary
from bench._coldstart_scenarios import Sample, SwitchSamples, parse_server_timing

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_quick_run_reports_every_scenario(tmp_path: Path) -> None:
    png = tmp_path / "chart.png"
    cmd = [sys.executable, "-m", "cli.main", "bench", "coldstart", "--quick", "--json"]
    proc = subprocess.run(
        [*cmd, "--png", str(png)], cwd=REPO, capture_output=True, text=True, timeout=1400
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads(proc.stdout)
    assert set(doc["scenarios"]) == set(SCENARIOS)
    for key, s in doc["scenarios"].items():
        assert s["n"] >= 1 and s["median_s"] >= 0 and s["p95_s"] >= s["median_s"] - 1e-9, key
    assert {"imports_s", "load_s", "forward_s"} <= set(doc["scenarios"]["naive"]["phases_ms"])
    assert "download_s" in doc["scenarios"]["boto3_s3"]["phases_ms"]
    for key in ("thaw_pool_hit", "thaw_pool_miss", "thaw_pool_miss_spawn", "thaw_s3"):
        assert "weights_fetch" in doc["scenarios"][key]["phases_ms"], key  # from Server-Timing
    assert doc["scenarios"]["thaw_pool_miss"]["phases_ms"]["process_start"] > 0
    # A miss forks the zygote, whose imports were paid before; a spawn pays them.
    spawned = doc["scenarios"]["thaw_pool_miss_spawn"]["phases_ms"]
    assert doc["scenarios"]["thaw_pool_miss"]["phases_ms"]["imports"] < spawned["imports"]
    assert doc["scenarios"]["thaw_pool_hit"]["phases_ms"]["process_start"] == 0
    trace = doc["trace"]
    assert trace["scale_to_zero"]["cold_rate"] > 0  # every burst after an idle gap starts cold
    assert trace["keep_warm"]["cold_rate"] == 0
    assert [r["name"] for r in doc["ratios"]] == [t.name for t in TARGETS]
    assert all(r["value"] is not None for r in doc["ratios"])
    assert png.stat().st_size > 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_server_timing_is_parsed_into_ms_by_name() -> None:
    header = "schedule;dur=1.5, weights_fetch;dur=20, desc;desc=x, total;dur=3e1"
    assert parse_server_timing(header) == {"schedule": 1.5, "weights_fetch": 20.0, "total": 30.0}
    assert parse_server_timing("") == {}


def test_pool_hit_means_the_worker_paid_no_process_start() -> None:
    assert Sample(1.0, True, {"process_start": 0.0, "imports": 1300.0}).pool_hit
    assert not Sample(1.0, True, {"process_start": 150.0, "imports": 9000.0}).pool_hit


def test_switch_overhead_pairs_each_switch_with_the_next_same_adapter_call() -> None:
    switches = SwitchSamples(
        switch=[Sample(0.30, False), Sample(0.10, False)],
        same=[Sample(0.25, False), Sample(0.12, False)],
    )
    assert switches.overhead_s() == pytest.approx([0.05, 0.0])  # no execution timing: totals
    by_execution = SwitchSamples(
        switch=[Sample(0.30, False, {"execution": 12.0})],
        same=[Sample(0.10, False, {"execution": 10.0})],
    )
    assert by_execution.overhead_s() == pytest.approx([0.002])
    measured = SwitchSamples(  # the function reports its set_adapter: that is the switch
        switch=[Sample(0.30, False, {"execution": 12.0, "adapter_switch": 0.4})],
        same=[Sample(0.10, False, {"execution": 10.0})],
    )
    assert measured.overhead_s() == pytest.approx([0.0004])


def test_ratios_compare_medians_and_the_adapter_p99_with_their_targets() -> None:
    scenarios = {
        "naive": summary([10.0, 10.0]),
        "thaw_pool_hit": summary([0.5, 0.5]),
        "thaw_pool_miss": summary([5.0, 5.0]),
        "boto3_s3": summary([4.0]),
        "thaw_s3": summary([1.0]),
        "adapter_switch": summary([0.001, 0.05]),
    }
    got = {r["name"]: (r["value"], r["met"]) for r in ratios(scenarios)}
    assert got["pool hit / naive"] == (pytest.approx(0.05), True)
    assert got["pool miss / naive"] == (pytest.approx(0.5), False)
    assert got["S3-only / boto3 download-then-load"] == (pytest.approx(0.25), True)
    value, met = got["adapter switch p99 (s)"]
    assert value == pytest.approx(0.04951) and met is False
    assert all(r["value"] is None for r in ratios({}))
