"""bench/detokenize.py on a short completion: both ways give the completion's text
(the bench raises otherwise), a row of medians and ratios, and its table."""

from __future__ import annotations

import pytest

from bench import detokenize as bench
from examples.build_model import build_tokenizer


def test_a_quick_run_measures_both_ways_on_the_same_text(
    capsys: pytest.CaptureFixture[str],
) -> None:
    row = bench.measure(build_tokenizer(), tokens=40, trials=2)
    assert row["tokens"] == 40
    assert row["stream_ms"] > 0 and row["whole_ms"] > 0
    assert row["ratio"] == pytest.approx(row["whole_ms"] / row["stream_ms"])
    assert bench.main(["--tokens", "16", "--trials", "1"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("| tokens | stream ms | whole ms")
    assert out.splitlines()[2].startswith("| 16 |")


def test_the_whole_decode_is_the_tokenizer_without_its_fast_backend() -> None:
    from worker.llm.detokenize import IncrementalDetokenizer

    tokenizer = build_tokenizer()
    from worker.llm.detokenize import _Stream, _WholeDecode

    assert isinstance(IncrementalDetokenizer(tokenizer)._way, _Stream)
    assert isinstance(IncrementalDetokenizer(bench.WholeDecode(tokenizer))._way, _WholeDecode)
