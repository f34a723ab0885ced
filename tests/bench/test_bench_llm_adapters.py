"""bench/llm_adapters.py: mixed-adapter batches against one adapter at a time, on the
tiny example model: both modes at each level, the same draws, the greedy answers
compared."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from bench import llm_adapters


def test_the_zipf_mix_favours_the_first_ranks_and_repeats_with_its_seed() -> None:
    names = [f"a{i}" for i in range(8)]
    draws = llm_adapters.zipf_mix(names, 4000, 1.0, seed=7)
    assert draws == llm_adapters.zipf_mix(names, 4000, 1.0, seed=7)
    counts = Counter(draws)
    assert counts["a0"] > 2 * counts["a3"] > 0 and set(counts) == set(names)
    assert len(set(llm_adapters.zipf_mix(names, 64, 0.0, seed=1))) > 4  # s 0: uniform


def test_a_quick_run_shows_both_modes_at_each_level(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "adapters.json"
    args = ["--quick", "--adapters", "3", "--streams", "2,4", "--rounds", "2"]
    args += ["--max-tokens", "6", "--kv-cache-mb", "8", "--max-num-seqs", "4"]
    args += ["--data-dir", str(tmp_path), "--json", str(out)]
    assert llm_adapters.main(args) == 0
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert [(r["mode"], r["streams"]) for r in rows] == [
        (llm_adapters.MIXED, 2),
        (llm_adapters.ONE_AT_A_TIME, 2),
        (llm_adapters.MIXED, 4),
        (llm_adapters.ONE_AT_A_TIME, 4),
    ]
    assert all(r["tokens_per_s"] > 0 and r["rounds"] == 2 for r in rows)
    # The adapters say different things, and the same through either mode.
    assert result["greedy_same"] == 3 and result["greedy_distinct"] > 1
    assert result["mixed_steps"] > 0  # calls of several adapters shared steps
    shown = capsys.readouterr().out
    assert "x one at a time" in shown and "3 of 3" in shown
