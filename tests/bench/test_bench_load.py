"""The loader bench runs end to end (tiny model, one trial) and reports every row.

No timing assertions: speed claims live in bench/README.md, not in tests.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench._common import percentile, round_robin_order
from bench._load_rows import CATALOG, RATIOS, Ratio, ratio_value, select_rows
from bench._model import BF16_BYTES, plan_shards, plan_tensors

REPO = Path(__file__).resolve().parents[2]


def _run_bench(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(REPO / "bench" / "load.py"), "--quick", "--data-dir", str(tmp_path)]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=600, check=False)


@pytest.mark.slow
def test_quick_run_reports_every_row_with_correct_bytes(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    proc = _run_bench(tmp_path / "data", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    rows = {r["key"]: r for r in doc["rows"]}
    assert set(rows) == {r.key for r in CATALOG}
    ran = [r for r in rows.values() if not r["skipped"]]
    assert {r["key"] for r in ran} >= {
        "read/cold", "read/warm", "memcpy/memory", "safetensors/cold", "runai/warm",
        "tensorizer/warm", "thaw/cold", "thaw/warm", "thaw-ram/memory", "boto3-s3/s3",
        "thaw-s3/s3",
    }  # fmt: skip
    for r in ran:
        assert len(r["trials"]) == 1
        assert r["median_s"] > 0 and r["bytes"] > 0
        assert r["trials"][0]["cpu_s"] >= 0 and r["trials"][0]["process_s"] > r["median_s"]
        assert r["checksum_ok"] in (True, None), r["key"]  # None: ceilings hold no tensors
    assert rows["thaw/warm"]["checksum_ok"] is True
    assert rows["thaw/cold"]["trials"][0]["resident_fraction"] < 0.5  # the drop happened
    assert rows["thaw/warm"]["trials"][0]["resident_fraction"] == 1.0
    assert rows["thaw/warm"]["thaw_report"]["store_bytes"] == 0  # served by the disk cache
    assert rows["thaw-s3/s3"]["thaw_report"]["cache_hit_bytes"] == 0  # empty cache each trial
    ram = rows["thaw-ram/memory"]["thaw_report"]
    assert ram["ram_tier_bytes"] == ram["tensor_bytes"] > 0  # served by the RAM tier
    for r in rows.values():  # a skipped row says why, e.g. "no CUDA device"
        assert r["skipped"] is None or (isinstance(r["skipped"], str) and r["skipped"])
    assert [x["name"] for x in doc["ratios"]] == [r.name for r in RATIOS]
    by_name = {r.name: r for r in RATIOS}
    for x in doc["ratios"]:
        ratio = by_name[x["name"]]
        both_ran = not rows[ratio.numerator]["skipped"] and not rows[ratio.denominator]["skipped"]
        # A ratio of two rows that ran has a value; one with a skipped row (CUDA, here
        # without a GPU, or a peer not installed) has none.
        assert (x["value"] is not None and x["cpu_value"] is not None) is both_ran, x["name"]


@pytest.mark.slow
def test_json_dash_prints_one_object_and_methods_selects_rows(tmp_path: Path) -> None:
    proc = _run_bench(tmp_path, "--methods", "read,memcpy", "--json", "-")
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert [r["key"] for r in doc["rows"]] == ["read/cold", "read/warm", "memcpy/memory"]


def test_unknown_method_is_refused_with_the_valid_names(tmp_path: Path) -> None:
    proc = _run_bench(tmp_path, "--methods", "nope")
    assert proc.returncode == 2
    assert "unknown method(s) nope" in proc.stdout + proc.stderr


def test_round_robin_runs_every_row_once_per_trial_rotated() -> None:
    rows = ["a", "b", "c"]
    orders = [round_robin_order(rows, t) for t in range(4)]
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]


def test_percentile_interpolates_and_refuses_empty() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 50) == 3.0
    assert percentile([1.0, 2.0], 95) == pytest.approx(1.95)
    with pytest.raises(ValueError, match="at least one trial"):
        percentile([], 50)


def test_select_rows_by_family_or_key_and_refuses_unknown() -> None:
    assert [r.key for r in select_rows(CATALOG, ["thaw"])] == ["thaw/cold", "thaw/warm"]
    assert [r.key for r in select_rows(CATALOG, ["runai/warm"])] == ["runai/warm"]
    with pytest.raises(ValueError, match="choose from"):
        select_rows(CATALOG, ["thaw", "bogus"])


def test_ratio_is_throughput_over_throughput_and_none_when_missing() -> None:
    ratio = Ratio("x", "a/warm", "b/warm", 3.0)
    assert ratio_value({"a/warm": 6.0, "b/warm": 2.0}, ratio) == 3.0
    assert ratio_value({"a/warm": 6.0}, ratio) is None


@pytest.mark.parametrize("size_mb", [8, 64, 512, 1024])
def test_model_plan_is_close_to_the_asked_size_and_shards_cover_it(size_mb: int) -> None:
    _, tensors = plan_tensors(size_mb << 20)
    total = sum(BF16_BYTES * _numel(s) for s in tensors.values())
    assert abs(total - (size_mb << 20)) / (size_mb << 20) < 0.1
    shards = plan_shards(tensors, 4)
    assert [n for s in shards for n in s] == list(tensors)  # every tensor once, in order
    assert 1 < len(shards) <= 4


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
