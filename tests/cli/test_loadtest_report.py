"""The loadtest summary from call samples (pure), its table and its chart."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.loadtest_llm import LlmLoad, LlmLoadError, LlmResult, load_prompts
from cli.loadtest_report import llm_table, results_table, summarize, write_png
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


# --- LLM functions -----------------------------------------------------------------

LLM_PARAMS = {**PARAMS, "function": "chat", "model": "chat:pirate", "llm": True, "stream": True}


def _llm_calls() -> list[CallSample]:
    def stream(ttft_s: float, tpot_s: float | None, cold: bool | None) -> CallSample:
        return CallSample(0.0, 1.0, ttft_s, cold, True, 200, None, tpot_s, 7, 32)

    warm = [stream(0.05 + i * 0.01, 0.010, False) for i in range(8)]
    slow_tokens = [stream(0.05, 0.030, False)]
    cold = [stream(2.0, 0.012, True)]
    one_token = [stream(0.05, None, False)]
    failed = [CallSample(0.5, 0.1, None, None, False, 429, "429 rate limited")]
    return warm + slow_tokens + cold + one_token + failed


def test_llm_summary_has_token_figures_and_goodput() -> None:
    calls = _llm_calls()
    doc = summarize(calls, [], 2.0, LLM_PARAMS, slo_ttft_ms=500, slo_tpot_ms=20)
    assert doc["completion_tokens"] == 11 * 32 and doc["prompt_tokens"] == 11 * 7
    assert doc["output_tokens_per_s"] == 11 * 32 / 2.0
    tpot = doc["tpot_ms"]
    assert tpot["p50"] <= tpot["p90"] <= tpot["p95"] <= tpot["p99"] <= tpot["max"] == 30.0
    assert doc["cold"]["tpot_ms"]["p50"] == 12.0 and doc["cold"]["ttft_ms"]["p50"] == 2000.0
    # 8 fast warm and the one-token call meet both; the slow-token, cold and failed do not
    good = doc["goodput"]
    assert (good["calls"], good["slo_ttft_ms"], good["slo_tpot_ms"]) == (9, 500, 20)
    assert good["share"] == 9 / 12 and good["per_s"] == 4.5


def test_a_call_that_ended_with_no_text_is_held_to_the_ttft_slo_by_its_end() -> None:
    # The model ended at once: no text, so no TTFT; its (empty) answer came at its end.
    quick = CallSample(0.0, 0.2, None, False, True, 200, None, None, 7, 0)
    slow = CallSample(0.0, 0.9, None, False, True, 200, None, None, 7, 0)
    doc = summarize([quick, slow], [], 1.0, LLM_PARAMS, slo_ttft_ms=500, slo_tpot_ms=20)
    assert doc["goodput"]["calls"] == 1 and doc["goodput"]["share"] == 0.5


def test_goodput_needs_an_slo_and_counts_only_the_ones_given() -> None:
    calls = _llm_calls()
    assert summarize(calls, [], 2.0, LLM_PARAMS)["goodput"] is None
    ttft_only = summarize(calls, [], 2.0, LLM_PARAMS, slo_ttft_ms=500)["goodput"]
    assert ttft_only["calls"] == 10  # the slow-token call meets a TTFT-only SLO
    assert "tpot_ms" not in summarize(_calls(), [], 2.0, PARAMS)


def test_llm_table_shows_ttft_and_tpot_percentiles_and_goodput() -> None:
    doc = summarize(_llm_calls(), [], 2.0, LLM_PARAMS, slo_ttft_ms=500, slo_tpot_ms=20)
    table = llm_table(doc)
    assert "chat:pirate" in table.title and "2 concurrent streams" in table.title
    headers = [c.header for c in table.columns]
    assert headers[2:] == [
        f"{m} {q}" for m in ("TTFT", "TPOT") for q in ("p50", "p90", "p95", "p99")
    ]
    cold = table.rows[2]
    assert cold[:3] == ["cold", "1", "2000.0"] and cold[6] == "12.0"
    caption = table.caption or ""
    assert "176.0 output tokens/s" in caption
    assert "goodput 75.0% of calls (4.50/s) within TTFT <= 500 ms and TPOT <= 20 ms" in caption


def test_llm_request_body_rotates_prompts_and_seeds() -> None:
    load = LlmLoad("chat:pirate", prompts=("a", "b"), max_tokens=8)
    first, third = load.body(0), load.body(2)
    assert first["messages"] == [{"role": "user", "content": "a"}] == third["messages"]
    assert (first["seed"], third["seed"], first["max_tokens"]) == (0, 2, 8)
    assert first["stream"] and first["stream_options"] == {"include_usage": True}
    text = LlmLoad("chat", prompts=("a", "b"), endpoint="completions")
    assert text.body(1)["prompt"] == "b" and text.path == "/openai/v1/completions"
    assert "ignore_eos" not in first
    assert LlmLoad("chat", ignore_eos=True).body(0)["ignore_eos"] is True


def test_tpot_is_the_mean_gap_after_the_first_token() -> None:
    assert LlmResult(200, ttft_s=0.1, end_s=1.1, completion_tokens=11).tpot_s == 0.1
    assert LlmResult(200, ttft_s=0.1, end_s=0.1, completion_tokens=1).tpot_s is None


def test_prompts_file_lines_or_json_lines(tmp_path: Path) -> None:
    plain = tmp_path / "plain.txt"
    plain.write_text("first prompt\n\nsecond one\n")
    assert load_prompts(plain) == ("first prompt", "second one")
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"prompt": "x"}\n{"prompt": "y y"}\n')
    assert load_prompts(jsonl) == ("x", "y y")
    jsonl.write_text('{"prompt": "x"}\n{"text": "y"}\n')
    with pytest.raises(LlmLoadError, match='line 2: expected a JSON object with "prompt"'):
        load_prompts(jsonl)
    with pytest.raises(LlmLoadError, match="no prompts"):
        (tmp_path / "empty").write_text("\n")
        load_prompts(tmp_path / "empty")
    with pytest.raises(LlmLoadError, match="No such file"):
        load_prompts(tmp_path / "missing")
