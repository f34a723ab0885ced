"""bench/llm.py's figures and table, from made-up stream timings (no server)."""

from __future__ import annotations

import pytest

from bench.llm import StreamTiming, _with_ratios, level_row, parse_args, table


def test_a_level_gives_tokens_per_s_ttft_and_tpot_medians_over_rounds() -> None:
    one = [StreamTiming(0.0, 0.1, 1.1, 11), StreamTiming(0.0, 0.3, 2.0, 18)]
    two = [StreamTiming(0.0, 0.2, 1.0, 9), StreamTiming(0.5, 0.6, 1.5, 1)]
    row = level_row(2, [one, two])
    # round one: 29 tokens over 2.0 s; round two: 10 tokens over 1.5 s
    assert row["tokens_per_s"] == pytest.approx((29 / 2.0 + 10 / 1.5) / 2)
    # TTFT p50: round one (100, 300) -> 200 ms, round two (200, 100) -> 150 ms
    assert row["ttft_p50_ms"] == pytest.approx(175.0)
    # TPOT: round one 100 and 100 ms; round two 100 ms (a 1-token stream has none)
    assert row["tpot_p50_ms"] == pytest.approx(100.0)
    assert row["tokens"] == pytest.approx(19.5)


def test_a_stream_with_no_text_has_no_ttft_and_the_table_shows_a_dash() -> None:
    row = level_row(1, [[StreamTiming(0.0, None, 0.5, 0)]])
    assert row["ttft_p50_ms"] is None and row["tokens_per_s"] == 0.0
    spec = table([row], "t")
    assert spec.rows == [["", "1", "0.0", "-", "-", "-", "0", "-", "-"]]


def test_thaw_rows_get_their_ratio_and_added_ttft_against_the_engine() -> None:
    figures = {"ttft_p99_ms": None, "tpot_p50_ms": None, "tokens": None}
    thaw = {"mode": "thaw (OpenAI routes)", "streams": 8, "tokens_per_s": 90.0, **figures}
    engine = {"mode": "engine in-process", "streams": 8, "tokens_per_s": 100.0, **figures}
    rows = _with_ratios([{**thaw, "ttft_p50_ms": 30.0}, {**engine, "ttft_p50_ms": 10.0}])
    assert rows[0]["tokens_per_s_vs_engine"] == pytest.approx(0.9)
    assert rows[0]["ttft_p50_added_ms"] == pytest.approx(20.0)
    assert "tokens_per_s_vs_engine" not in rows[1]
    assert table(rows, "t").rows[0][-2:] == ["0.90", "20.0"]


def test_bad_arguments_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, said in [
        (["--streams", "1,x", "--key", "k"], "--streams takes numbers"),
        (["--streams", "0", "--key", "k"], "must be positive"),
        (["--key", ""], "no API key"),
    ]:
        with pytest.raises(SystemExit):
            parse_args(argv)
        assert said in capsys.readouterr().err
