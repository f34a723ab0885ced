"""The loadtest summary from call samples (pure), its table and its chart."""

from __future__ import annotations

from pathlib import Path

from cli.loadtest_report import results_table, summarize, write_png
from cli.loadtest_run import CallSample, QueueSample, queue_sample

PARAMS = {"function": "echo", "duration_s": 2.0, "stream": False, "concurrency": 2}


def _calls() -> list[CallSample]:
    warm = [CallSample(i * 0.1, 0.010 + i * 0.001, 0.005, False, True, 200) for i in range(10)]
    cold = [CallSample(0.0, 1.5, 1.2, True, True, 200)]
    bad = [CallSample(1.5, 0.2, None, None, False, 500, "500 boom")] * 2
    return warm + cold + bad


def test_summary_counts_splits_and_orders_percentiles() -> None:
    queue = [QueueSample(0.0, 3.0, 0.0), QueueSample(0.5, 0.0, 1.0)]
    doc = summarize(_calls(), queue, elapsed_s=2.0, params=PARAMS)
    assert (doc["calls"], doc["ok"], doc["errors"]) == (13, 11, 2)
    assert doc["error_examples"] == ["500 boom"]
    assert doc["throughput_per_s"] == 5.5
    assert (doc["warm"]["calls"], doc["cold"]["calls"]) == (10, 1)
    lat = doc["latency_ms"]
    assert lat["p50"] <= lat["p90"] <= lat["p95"] <= lat["p99"] <= lat["max"] == 1500.0
    assert doc["cold"]["ttft_ms"]["p50"] == 1200.0
    assert doc["warm"]["latency_ms"]["max"] < 20.0
    assert doc["max_queue_depth"] == 3.0
    assert doc["per_second"] == [
        {"t_s": 0, "calls": 11, "errors": 0},
        {"t_s": 1, "calls": 2, "errors": 2},
    ]
    table = results_table(doc)
    assert [row[0] for row in table.rows] == ["all", "warm", "cold"]
    assert "2 errors" in (table.caption or "")


def test_a_run_with_no_successful_call_has_no_percentiles() -> None:
    bad = [CallSample(0.0, 0.1, None, None, False, 0, "ConnectError")]
    doc = summarize(bad, [], elapsed_s=1.0, params=PARAMS)
    assert doc["latency_ms"] is None and doc["max_queue_depth"] is None
    assert results_table(doc).rows[0][2] == "-"


def test_queue_sample_reads_this_functions_gauges() -> None:
    text = (
        'thaw_queue_depth{function="echo"} 4.0\n'
        'thaw_queue_depth{function="other"} 9.0\n'
        'thaw_replicas{function="echo",state="ready"} 2.0\n'
        'thaw_replicas{function="echo",state="starting"} 1.0\n'
    )
    assert queue_sample(text, "echo", 1.5) == QueueSample(1.5, 4.0, 2.0)
    assert queue_sample("", "echo", 0.0) == QueueSample(0.0, 0.0, 0.0)


def test_chart_is_a_png(tmp_path: Path) -> None:
    doc = summarize(_calls(), [QueueSample(0.0, 1.0, 1.0)], 2.0, PARAMS)
    path = tmp_path / "out" / "load.png"
    write_png(doc, _calls(), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
