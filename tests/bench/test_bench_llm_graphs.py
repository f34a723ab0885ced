"""bench/llm_graphs.py: the engine's CUDA graph settings side by side. On the CPU every
setting runs eagerly (graphs are CUDA's); the run still shows each setting's figures and
whether its greedy tokens equal the first setting's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import llm_graphs


def test_each_setting_changes_what_it_names() -> None:
    assert llm_graphs.overrides_of("eager", "cuda") == {}
    assert llm_graphs.overrides_of("thaw", "cuda") == {}
    assert llm_graphs.overrides_of("thaw-ahead", "cuda") == {"use_async_batching": True}
    assert llm_graphs.overrides_of("thaw-ahead", "cpu") == {"use_async_batching": False}
    padding = llm_graphs.overrides_of("transformers", "cuda")
    assert padding == {"q_padding_interval_size": 0, "kv_padding_interval_size": 0}


def test_a_quick_run_on_the_cpu_shows_every_setting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "graphs.json"
    args = ["--quick", "--device", "cpu", "--streams", "1,2", "--rounds", "1"]
    args += ["--max-tokens", "4", "--kv-cache-mb", "8"]
    args += ["--data-dir", str(tmp_path), "--json", str(out)]
    assert llm_graphs.main(args) == 0
    results = json.loads(out.read_text())["results"]
    assert [r["setting"] for r in results] == list(llm_graphs.SETTINGS)
    for r in results:
        assert r["graphs"] is False  # no CUDA here
        # every setting makes its steps' masks but the one named for the dense mask
        assert (r["dense_mask_mb"] > 0) is (r["setting"] == "eager-dense")
        assert r["first_request_ms"] > 0
        assert r["greedy"] == results[0]["greedy"] and all(r["greedy"])
        assert [lv["streams"] for lv in r["levels"]] == [1, 2]
        assert all(lv["tokens_per_s"] > 0 for lv in r["levels"])
    shown = capsys.readouterr().out
    assert "thaw-ahead" in shown and "greedy as eager" in shown and "dense mask MB" in shown


def test_bad_settings_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        llm_graphs.main(["--settings", "eager,fast", "--device", "cpu"])
    assert "unknown fast" in capsys.readouterr().err


def test_a_spread_round_sends_each_request_at_its_drawn_offset(tmp_path: Path) -> None:
    import argparse
    import random

    from bench import _llm_baselines as base
    from bench.llm import model_dir_of

    args = argparse.Namespace(model=None, quick=True, data_dir=tmp_path)
    sizes = {"max_num_seqs": 4, "max_batch_tokens": 64, "kv_cache_mb": 4}
    with base.in_process(model_dir_of(args), sizes) as ran:
        timings = ran.level(4, 2, spread_s=0.3, seed=5)
        at_once = ran.level(4, 2)
    draw = random.Random(5)
    offsets = [draw.uniform(0, 0.3) for _ in range(4)]
    for timing, offset in zip(timings, offsets, strict=True):
        assert offset <= timing.sent_s < offset + 0.1  # sent at its offset, not before
        assert timing.tokens == 2 and timing.end_s > timing.sent_s
    assert max(t.sent_s for t in at_once) < 0.1


def test_a_spread_run_shows_the_graphs_each_round_captured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "graphs.json"
    args = ["--quick", "--device", "cpu", "--settings", "thaw", "--streams", "2"]
    args += ["--rounds", "3", "--max-tokens", "3", "--spread-ms", "40"]
    args += ["--data-dir", str(tmp_path), "--json", str(out)]
    assert llm_graphs.main(args) == 0
    (level,) = json.loads(out.read_text())["results"][0]["levels"]
    assert level["captures_per_round"] == [0, 0, 0]  # no graphs off CUDA
    assert level["captures"] == 0 and level["capture_ms"] == 0
    shown = capsys.readouterr().out
    assert "sent over 40 ms" in shown and "captures a round" in shown
