"""bench/guidellm.py's reading of both tools' reports, its rows and prompts (the run
itself needs guidellm's own environment: ``python bench/guidellm.py``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.guidellm import (
    GUIDELLM,
    LOADTEST,
    BenchError,
    guidellm_figures,
    level_rows,
    loadtest_figures,
    parse_args,
    prompts_file,
    table,
)


def _stat(p50: float, p99: float, mean: float) -> dict[str, Any]:
    return {"mean": mean, "median": p50, "percentiles": {"p50": p50, "p90": p99, "p99": p99}}


def guidellm_report(ttft: float, itl: float, tokens_per_s: float) -> dict[str, Any]:
    """guidellm 0.8.1's JSON report, with only what the bench reads (shaped as a real
    run against thaw wrote it: completed requests apart from the cancelled ones)."""
    metrics = {
        "request_totals": {"successful": 8, "errored": 0, "incomplete": 4, "total": 12},
        "time_to_first_token_ms": {"successful": _stat(ttft, 2 * ttft, ttft)},
        "inter_token_latency_ms": {"successful": _stat(itl, 1.5 * itl, itl)},
        "output_tokens_per_second": {
            "successful": _stat(13.2, 102.9, 17.1),
            "total": _stat(14.5, 102.9, tokens_per_s),
        },
        "prompt_token_count": {"successful": _stat(64, 64, 64.0)},
        "output_token_count": {"successful": _stat(32, 32, 32.0)},
    }
    return {"metadata": {"guidellm_version": "0.8.1"}, "benchmarks": [{"metrics": metrics}]}


def loadtest_doc(ttft: float, tpot: float, tokens_per_s: float, calls: int = 12) -> dict[str, Any]:
    return {
        "llm": True,
        "ok": calls,
        "errors": 0,
        "ttft_ms": {"p50": ttft, "p99": 2 * ttft},
        "tpot_ms": {"p50": tpot, "p99": 1.5 * tpot},
        "output_tokens_per_s": tokens_per_s,
        "prompt_tokens": 64 * calls,
        "completion_tokens": 32 * calls,
        "error_examples": [],
    }


REPO = Path(__file__).resolve().parents[2]
SERVER = {"server_ttft_p50": 300.0, "server_tpot_p50": 90.0}


def test_each_tools_report_gives_the_same_figures() -> None:
    ours = guidellm_figures(guidellm_report(800.0, 100.0, 19.8))
    assert ours == {
        "ttft_p50": 800.0,
        "ttft_p99": 1600.0,
        "tpot_p50": 100.0,
        "tpot_p99": 150.0,
        "tokens_per_s": 19.8,  # the server throughput guidellm prints, over all requests
        "requests": 8,  # completed: the ones cancelled at the end are not in the figures
        "errors": 0,
        "prompt_tokens": 64.0,
        "output_tokens": 32.0,
    }
    theirs = loadtest_figures(loadtest_doc(600.0, 80.0, 22.0))
    assert theirs.keys() == ours.keys()
    assert (theirs["tpot_p99"], theirs["prompt_tokens"], theirs["output_tokens"]) == (120, 64, 32)


def test_reports_that_measured_nothing_are_refused() -> None:
    with pytest.raises(BenchError, match="one guidellm benchmark, found 0"):
        guidellm_figures({"benchmarks": []})
    with pytest.raises(BenchError, match="no LLM call"):
        loadtest_figures({**loadtest_doc(1, 1, 1), "ok": 0})


def test_rows_are_medians_over_rounds_with_guidellm_over_loadtest() -> None:
    gl = [{**guidellm_figures(guidellm_report(t, 100.0, 20.0)), **SERVER} for t in (700, 900, 800)]
    lt = [{**loadtest_figures(loadtest_doc(t, 80.0, 25.0)), **SERVER} for t in (400, 600, 500)]
    rows = level_rows(4, {GUIDELLM: gl, LOADTEST: lt})
    by_tool = {r["tool"]: r for r in rows}
    assert by_tool[GUIDELLM]["ttft_p50"] == 800 and by_tool[LOADTEST]["ttft_p50"] == 500
    assert by_tool[GUIDELLM]["requests"] == 24 and by_tool[LOADTEST]["requests"] == 36
    ratio = by_tool[GUIDELLM]["ratio"]
    assert ratio["ttft_p50"] == pytest.approx(1.6) and ratio["tpot_p50"] == pytest.approx(1.25)
    assert ratio["tokens_per_s"] == pytest.approx(0.8)
    assert by_tool[LOADTEST]["ratio"]["ttft_p50"] == 1.0
    doc = {"model": "m", "prompt_tokens": 64, "output_tokens": 32, "seconds": 30, "rounds": 3}
    shown = table({**doc, "rows": rows}).rows
    assert shown[0][:5] == ["4", GUIDELLM, "24", "800", "1.60"]
    assert shown[1][4] == ""  # loadtest is what the ratios are over


def test_loadtests_prompts_have_the_token_count_guidellm_asks_for(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from examples.build_model import build_model

    model = build_model(tmp_path / "model")
    path = prompts_file(model, 40, tmp_path / "prompts.jsonl", n=5)
    tokenizer = AutoTokenizer.from_pretrained(model)
    prompts = [json.loads(line)["prompt"] for line in path.read_text().splitlines()]
    assert len(prompts) == 5 and len(set(prompts)) == 5
    assert {len(tokenizer(p)["input_ids"]) for p in prompts} == {40}


def test_bad_options_are_named(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, says in (
        (["--concurrency", "2,x"], "numbers separated by commas"),
        (["--concurrency", "0"], "must be positive"),
        (["--output-tokens", "1"], "at least 2"),
        (["--url", "http://x"], "--url needs --key"),
    ):
        with pytest.raises(SystemExit):
            parse_args(argv)
        assert says in capsys.readouterr().err
    args = parse_args(["--quick", "--seconds", "30"])
    assert args.seconds == 8.0 and args.concurrency == [1, 4]


def test_thaw_bench_guidellm_refuses_a_directory_that_is_not_a_model(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "pytorch_model.bin").write_bytes(b"not unpickled")
    cmd = [sys.executable, "-m", "cli.main", "bench", "guidellm", "--model", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    said = " ".join(proc.stderr.split())
    assert "has no .safetensors weights" in said and "convert to safetensors" in said
