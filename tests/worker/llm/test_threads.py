"""Torch threads per engine step on a CPU (``worker.llm.threads``): the rule on given
step times, then the engine on a tiny model, where a step made wide really runs on
more threads and makes the same tokens, and the default leaves a tiny model (far under
a millisecond a token) on the replica's own threads."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch

from tests.worker.llm.test_engine import EOS, _prompts, generate_alone, run_to_end
from worker.llm.engine import Engine, EngineSizes, Sampling
from worker.llm.threads import StepThreadRule, StepThreads

SIZES = EngineSizes(max_num_seqs=8, max_batch_tokens=256, kv_cache_bytes=4 << 20)


def test_a_step_goes_wide_only_when_heavy_per_token_and_large_enough() -> None:
    rule = StepThreadRule(StepThreads(narrow=1, wide=4, wide_ms_per_token=3.0, min_tokens=8))
    assert rule.choose(32) == 1  # nothing measured yet
    rule.measured(1, 0.016, 8, 8)  # 2 ms a token: the serving path would fill the spare cores
    assert rule.choose(32) == 1
    rule.measured(1, 0.4, 8, 8)  # 50 ms a token: far past 3 ms even in a moving mean
    assert rule.ms_per_token > 3.0
    assert rule.choose(32) == 4
    assert rule.choose(7) == 1  # too few rows to split across threads
    assert (rule.steps, rule.wide_steps) == (2, 0)


def test_a_small_steps_time_does_not_count() -> None:
    # One sequence's step is all fixed cost (30 ms for its one token here): it never
    # goes wide, and must not make a light model look heavy for the batches after it.
    rule = StepThreadRule(StepThreads(narrow=1, wide=2, wide_ms_per_token=3.0))
    for _ in range(5):
        rule.measured(1, 0.030, 1, 1)
    assert rule.ms_per_token == 0.0 and rule.steps == 5
    rule.measured(1, 0.008, 16, 16)  # 0.5 ms a token at 16 rows: light
    assert rule.ms_per_token == pytest.approx(0.5) and rule.choose(16) == 1


def test_a_step_that_ends_one_prompt_does_not_make_a_light_model_look_heavy() -> None:
    # The first step ends one 12-token prompt: 6 ms for its one token, a whole prefill.
    rule = StepThreadRule(StepThreads(narrow=1, wide=2, wide_ms_per_token=3.0))
    rule.measured(1, 0.006, 12, 1)
    assert rule.ms_per_token == 0.0 and rule.choose(77) == 1  # one token: no mean yet
    rule.measured(1, 0.0077, 77, 8)  # the rest of the prompts end together
    assert rule.ms_per_token == pytest.approx((0.8 * 6 + 7.7) / (0.8 + 8))
    assert rule.choose(32) == 1
    for _ in range(20):  # then the model shows 5 ms a token, decoding: its old steps fade
        rule.measured(1, 0.040, 8, 8)
    assert rule.ms_per_token == pytest.approx(5.0, rel=0.01) and rule.choose(8) == 2


def test_a_wide_steps_time_counts_at_the_narrow_threads_and_prefill_chunks_count_none() -> None:
    rule = StepThreadRule(StepThreads(narrow=2, wide=4, wide_ms_per_token=3.0))
    rule.measured(4, 0.010, 10, 10)  # 1 ms a token on 4 threads: 2 ms on the narrow 2
    assert rule.ms_per_token == pytest.approx(2.0)
    rule.measured(4, 5.0, 256, 0)  # a prefill chunk that ends no prompt: no token to charge
    assert rule.ms_per_token == pytest.approx(2.0)
    assert (rule.steps, rule.wide_steps) == (2, 2)


def test_no_widening_without_spare_cores_or_with_the_option_off() -> None:
    for threads in (StepThreads(2, 2, 3.0), StepThreads(1, 2, 0.0)):
        rule = StepThreadRule(threads)
        rule.measured(1, 10.0, 64, 1)
        assert not threads.can_widen and rule.choose(64) == threads.narrow
    with pytest.raises(ValueError):
        StepThreads(narrow=3, wide=2)


def _eight_at_once(engine: Engine) -> list[list[int]]:
    prompts = [(p * 2)[:12] for p in _prompts()] + [[5, 6, 7] * 4, [9, 10, 11, 12] * 3]
    start = threading.Barrier(len(prompts))

    def one(prompt: list[int]) -> list[int]:
        start.wait()
        return run_to_end(engine, prompt, Sampling(max_new_tokens=24))[0]

    with ThreadPoolExecutor(len(prompts)) as pool:
        tokens = list(pool.map(one, prompts))
    for prompt, got in zip(prompts, tokens, strict=True):
        assert got == generate_alone(_model_of(engine), prompt, 24)
    return tokens


def _model_of(engine: Engine) -> Any:
    return engine._manager.model


def test_a_wide_step_runs_on_more_threads_and_makes_the_same_tokens(model: Any) -> None:
    seen: list[int] = []  # torch's threads in the generation thread, per forward pass
    hook = model.register_forward_pre_hook(lambda *_: seen.append(torch.get_num_threads()))
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        # Every step counts as heavy: a wide step is one with 8 tokens or more.
        engine = Engine(model, SIZES, [EOS], threads=StepThreads(1, 2, wide_ms_per_token=1e-9))
        try:
            _eight_at_once(engine)
            rule = engine.step_threads
            assert rule is not None and 0 < rule.wide_steps < rule.steps
        finally:
            engine.close()
    finally:
        hook.remove()
        torch.set_num_threads(before)
    assert set(seen) == {1, 2}, seen  # wide prefills, narrow steps of fewer tokens
    assert seen.count(2) == rule.wide_steps


def test_by_default_a_tiny_model_stays_on_the_replicas_threads(model: Any) -> None:
    # The tiny model spends a small fraction of a millisecond a token, under 3 ms, on
    # the generation thread's CPU clock, however busy the machine is.
    engine = Engine(model, SIZES, [EOS], threads=StepThreads(1, 2))
    try:
        _eight_at_once(engine)
        rule = engine.step_threads
        assert rule is not None and rule.steps > 0
        assert rule.wide_steps == 0, rule.ms_per_token
        assert 0 < rule.ms_per_token < 3.0
    finally:
        engine.close()


def test_an_engine_given_no_spare_core_is_left_as_it_is(model: Any) -> None:
    engine = Engine(model, SIZES, [EOS], threads=StepThreads(2, 2))
    try:
        assert engine.step_threads is None
    finally:
        engine.close()
