"""bench/llm_prefix.py: prompt-prefix KV reuse against none, on the tiny example model
with adapters: both modes at each level, tenants' system prompts found cached through
their own adapter, the greedy answers the same through both."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import llm_prefix


def test_a_quick_run_shows_both_modes_and_reuse_that_changes_no_answer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "prefix.json"
    args = ["--quick", "--adapters", "3", "--streams", "1,4", "--rounds", "2"]
    args += ["--system-tokens", "140", "--max-tokens", "4", "--kv-cache-mb", "8"]
    args += ["--max-num-seqs", "4", "--data-dir", str(tmp_path), "--json", str(out)]
    assert llm_prefix.main(args) == 0
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert [(r["mode"], r["streams"]) for r in rows] == [
        (llm_prefix.REUSED, 1),
        (llm_prefix.PREFILLED, 1),
        (llm_prefix.REUSED, 4),
        (llm_prefix.PREFILLED, 4),
    ]
    assert all(r["tokens_per_s"] > 0 and r["rounds"] == 2 for r in rows)
    # Two 64-token blocks of each ~170-token prompt are its tenant's, found cached.
    assert 0.5 < result["hit_share"] < 1 and result["prefilled_lookups"] == 0
    assert result["greedy_same"] == 3 and result["greedy_distinct"] > 1
    shown = capsys.readouterr().out
    assert "x prefilled" in shown and "3 of 3" in shown
