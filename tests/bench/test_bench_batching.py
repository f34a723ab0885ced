"""bench/batching.py's rows and table, from made-up measurements (no replicas)."""

from __future__ import annotations

from bench.batching import Run, table


def test_row_rates_percentiles_and_mean_batch() -> None:
    run = Run("batched (max 8)", 4, 2.0, [10.0, 20.0, 30.0, 40.0], tokens=40, batch_sizes=[4, 2])
    row = run.row()
    assert (row["calls"], row["calls_per_s"], row["tokens_per_s"]) == (4, 2.0, 20.0)
    assert row["p50_ms"] == 25.0 and 38.0 < row["p95_ms"] <= 40.0
    assert row["mean_batch"] == 3.0 and row["errors"] == 0


def test_an_unbatched_run_reports_batches_of_one_and_the_table_has_a_row_each() -> None:
    rows = [Run("one at a time", 1, 1.0, [5.0], tokens=3).row(), Run("x", 2, 1.0).row()]
    assert rows[0]["mean_batch"] == 1 and rows[1]["calls"] == 0
    spec = table(rows, "t")
    assert [r[0] for r in spec.rows] == ["one at a time", "x"]
    assert spec.rows[0][2] == "1.0"  # calls/s
