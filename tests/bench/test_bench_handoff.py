"""bench/handoff.py on a few steps: every token is handed over in both arrangements,
and the table sets them side by side."""

from __future__ import annotations

import pytest

from bench.handoff import ONE_THREAD, PER_STREAM, main, one_thread, per_stream, run, table


def test_both_arrangements_hand_over_every_token_and_are_set_side_by_side() -> None:
    doc = run(streams=4, steps=5, trials=2)
    assert set(doc["us_per_token"]) == {PER_STREAM, ONE_THREAD}
    assert all(len(us) == 2 and min(us) > 0 for us in doc["us_per_token"].values())
    assert doc["ratio"] == pytest.approx(
        doc["median_us_per_token"][PER_STREAM] / doc["median_us_per_token"][ONE_THREAD]
    )
    rows = table(doc).rows
    assert [r[0] for r in rows] == [PER_STREAM, ONE_THREAD] and rows[1][2] == "1.0"


def test_each_arrangement_returns_once_its_threads_are_done() -> None:
    for arrangement in (per_stream, one_thread):
        assert arrangement(3, 4) > 0  # CPU was spent; a reader still waiting would hang


def test_bad_sizes_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--streams", "0"])
    assert "--streams, --steps and --trials must be at least 1" in capsys.readouterr().err
