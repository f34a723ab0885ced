"""bench/llm_sampling.py: per-request penalties and logprobs against plain sampling on
the tiny example model: every mode at each level, and the logprobs modes handed one
entry per token with the alternatives asked, the others none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import llm_sampling


def test_a_quick_run_shows_every_mode_and_logprobs_only_where_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sampling.json"
    args = ["--quick", "--streams", "1,3", "--rounds", "2", "--max-tokens", "4"]
    args += ["--top-logprobs", "3", "--kv-cache-mb", "8", "--max-num-seqs", "4"]
    args += ["--data-dir", str(tmp_path), "--json", str(out)]
    assert llm_sampling.main(args) == 0
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert [(r["mode"], r["streams"]) for r in rows] == [
        (mode, streams) for streams in (1, 3) for mode in llm_sampling.MODES
    ]
    for r in rows:
        assert r["tokens_per_s"] > 0 and r["rounds"] == 2
        assert r["tokens"] == 4 * 2 * r["streams"]  # ignore_eos: every token asked for
        asked = r["mode"] in (llm_sampling.LOGPROBS, llm_sampling.ALL)
        assert r["logprob_entries"] == r["full_entries"] == (r["tokens"] if asked else 0)
    costs = [(c["processor"], c["rows"]) for c in result["processors"]]
    assert costs == [(p, n) for n in (1, 3) for p in ("penalties", "logprobs")]
    assert all(c["ms_per_step"] > 0 for c in result["processors"])
    shown = capsys.readouterr().out
    assert "x plain" in shown and "of plain TPOT p50" in shown
