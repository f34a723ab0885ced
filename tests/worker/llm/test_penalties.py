"""Penalties, logit bias and min_p: the processors against transformers' own (repetition, min_p)
and OpenAI's formula (frequency, presence); the dense form of captured steps against
the sparse one; in the engine, a penalised greedy request beside plain ones equals
``model.generate`` with the same penalty, and the plain ones are untouched."""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch
from transformers import MinPLogitsWarper, RepetitionPenaltyLogitsProcessor
from transformers.generation.continuous_batching.requests import (
    FutureRequestState,
    RequestState,
)

from tests.worker.llm.test_engine import EOS, VOCAB, _prompts, generate_alone
from worker.llm.engine import Engine, Sampling
from worker.llm.penalties import (
    MinP,
    Penalties,
    apply_sparse,
    min_p_rows,
    prompt_and_output,
    step_penalties,
)

NEG_INF = float("-inf")


def _request(prompt: list[int], output: list[int], **kwargs: Any) -> FutureRequestState:
    state = RequestState(request_id="r", initial_tokens=prompt, logit_processor_kwargs=kwargs)
    state.generated_tokens = list(output)
    return FutureRequestState(state, has_new_token=True, complete_blocks={}, query_length=1)


def _openai(scores: torch.Tensor, output: list[int], frequency: float, presence: float) -> None:
    """OpenAI's formula, in place on one row."""
    for token, count in Counter(output).items():
        scores[token] -= count * frequency + presence


def test_repetition_is_transformers_own_and_frequency_and_presence_are_openais() -> None:
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(3, 32, generator=g) * 3
    requests = [
        _request([1, 2, 3, 3], [5, 5, 9], repetition_penalty=1.4),
        _request([4, 6], [6, 7, 7, 7, 8], frequency_penalty=0.5, presence_penalty=-0.25),
        _request([10, 11], [12]),  # no penalty: its row is left
    ]
    processor = Penalties(None, 32, torch.device("cpu"))
    args = processor.prepare_tensor_args(requests)
    assert args.tolist() == [1, 1, 0]
    out = processor(scores, args)

    expected = scores.clone()
    hf = RepetitionPenaltyLogitsProcessor(1.4)
    expected[0] = hf(torch.tensor([[1, 2, 3, 3, 5, 5, 9]]), scores[:1].clone())[0]
    _openai(expected[1], [6, 7, 7, 7, 8], 0.5, -0.25)
    assert torch.allclose(out, expected)
    assert not torch.equal(out[0], scores[0]) and not torch.equal(out[1], scores[1])
    assert torch.equal(out[2], scores[2])
    assert torch.equal(scores, expected) is False  # the step's scores are not changed in place


def test_all_three_at_once_apply_repetition_first() -> None:
    scores = torch.tensor([[2.0, -2.0, 1.0, 0.5]])
    step = step_penalties(
        [{"repetition_penalty": 2.0, "frequency_penalty": 1.0, "presence_penalty": 0.5}],
        [_request([0], [1, 1]).state],
    )
    assert step is not None
    # 0: in the prompt only, 2 / 2; 1: in the output twice, -2 * 2 - 2 * 1 - 0.5
    assert apply_sparse(scores, step).tolist() == [[1.0, -6.5, 1.0, 0.5]]


def test_a_step_without_a_penalty_costs_nothing() -> None:
    processor = Penalties(None, 32, torch.device("cpu"))
    scores = torch.randn(2, 32)
    args = processor.prepare_tensor_args([_request([1], [2]), _request([3], [])])
    assert processor(scores, args) is scores


def test_frequency_and_presence_need_an_output() -> None:
    step = step_penalties([{"frequency_penalty": 1.0}], [_request([1, 2], []).state])
    assert step is None  # the prompt is not penalised by them (OpenAI, vLLM)


def test_the_dense_form_of_captured_steps_equals_the_sparse_one() -> None:
    g = torch.Generator().manual_seed(3)
    dense = Penalties(4, 32, torch.device("cpu"))
    sparse = Penalties(None, 32, torch.device("cpu"))
    steps = [
        [_request([1, 2], [3, 3], repetition_penalty=0.7), _request([5], [6], presence_penalty=1)],
        [_request([1], [2])],  # the buffers are reset after a penalised step
        [_request([8], [8, 9], frequency_penalty=2.0), _request([1], [], repetition_penalty=3)],
        [_request([1], [2], logit_bias=((2, -5.0), (7, 3.5)), repetition_penalty=1.5)],
        [_request([1], []), _request([4], [], logit_bias=((31, 100.0),))],
    ]
    for requests in steps:
        scores = torch.randn(len(requests), 32, generator=g)
        want = sparse(scores, sparse.prepare_tensor_args(requests))
        got = dense(scores, dense.prepare_tensor_args(requests))
        assert torch.allclose(got, want)


def test_a_logit_bias_is_added_before_the_repetition_penalty() -> None:
    scores = torch.tensor([[1.0, -1.0, 2.0, 0.5], [1.0, 1.0, 1.0, 1.0]])
    requests = [
        _request([2], [], logit_bias=((0, 3.0), (2, -4.0)), repetition_penalty=2.0),
        _request([2], [], logit_bias=((3, -100.0),)),
    ]
    processor = Penalties(None, 4, torch.device("cpu"))
    out = processor(scores, processor.prepare_tensor_args(requests))
    # row 0: token 0 biased to 4; token 2 (in the prompt) biased to -2, then times 2
    assert out.tolist() == [[4.0, -1.0, -4.0, 0.5], [1.0, 1.0, 1.0, -99.0]]


@pytest.mark.parametrize(
    ("bias", "says"),
    [
        (((1, 100.5),), "from -100 to 100"),
        (((1, float("nan")),), "from -100 to 100"),
        (((-1, 1.0),), "a token id is an integer >= 0"),
        (((1, 1.0), (1, 2.0)), "names a token twice"),
        (tuple((t, 1.0) for t in range(1025)), "at most 1024"),
    ],
)
def test_a_logit_bias_out_of_range_is_refused(bias: Any, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        Sampling(4, logit_bias=bias)


def test_a_reset_request_keeps_its_earlier_output_as_output() -> None:
    state = _request([1, 2, 3], [4, 5]).state
    reset = state.create_equivalent_initial_request()
    reset.generated_tokens = [6]
    assert prompt_and_output(reset) == ([1, 2, 3], [4, 5, 6])
    assert prompt_and_output(state) == ([1, 2, 3], [4, 5])


def test_min_p_is_transformers_own() -> None:
    g = torch.Generator().manual_seed(1)
    scores = torch.randn(3, 64, generator=g) * 2
    values = torch.tensor([0.0, 0.1, 0.5])
    out = min_p_rows(scores, values)
    assert torch.equal(out[0], scores[0])
    for row in (1, 2):
        hf = MinPLogitsWarper(float(values[row]))(torch.zeros(1, 1), scores[row : row + 1].clone())
        assert torch.equal(out[row], hf[0])
    assert (out[2] == NEG_INF).sum() > (out[1] == NEG_INF).sum() > 0


def test_min_p_runs_only_in_a_step_that_sets_it() -> None:
    processor = MinP(every_step=False)
    scores = torch.randn(2, 16)
    args = processor.prepare_tensor_args([_request([1], []), _request([2], [])])
    assert processor(scores, args) is scores
    args = processor.prepare_tensor_args([_request([1], []), _request([2], [], min_p=0.9)])
    out = processor(scores, args)
    assert torch.equal(out[0], scores[0]) and (out[1] == NEG_INF).sum() > 0


@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("repetition_penalty", 0.0),
        ("repetition_penalty", float("nan")),
        ("frequency_penalty", 2.5),
        ("presence_penalty", float("-inf")),
        ("min_p", 1.5),
        ("min_p", float("nan")),
    ],
)
def test_values_out_of_range_are_refused_by_name(field: str, bad: float) -> None:
    with pytest.raises(ValueError, match=field):
        Sampling(4, **{field: bad})


def test_only_the_values_set_reach_the_processors() -> None:
    assert not {"repetition_penalty", "min_p"} & set(Sampling(4).processor_kwargs(VOCAB))
    kwargs = Sampling(4, repetition_penalty=1.1, frequency_penalty=-1).processor_kwargs(VOCAB)
    assert kwargs["repetition_penalty"] == 1.1 and kwargs["frequency_penalty"] == -1.0
    assert "presence_penalty" not in kwargs


# --- in the engine -------------------------------------------------------------


def _tokens(engine: Engine, prompt: list[int], sampling: Sampling) -> list[int]:
    return [t for step in engine.generate(prompt, sampling) for t in step.token_ids]


def _generate(model: Any, prompt: list[int], n: int, **penalty: float) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt], device=model.device),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=model.device),
            do_sample=False,
            max_new_tokens=n,
            eos_token_id=EOS,
            pad_token_id=0,
            **penalty,
        )
    return list(out[0, len(prompt) :].tolist())


def _greedy_openai(model: Any, prompt: list[int], n: int, frequency: float, presence: float):
    """Greedy with OpenAI's penalties, one full forward a token."""
    tokens = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            scores = model(torch.tensor([tokens], device=model.device)).logits[0, -1].float().cpu()
            _openai(scores, tokens[len(prompt) :], frequency, presence)
            tokens.append(int(scores.argmax()))
            if tokens[-1] == EOS:
                break
    return tokens[len(prompt) :]


def test_penalised_requests_beside_plain_ones_answer_as_alone(model: Any, engine: Engine) -> None:
    prompts = _prompts()
    plain = Sampling(24)
    repeat = Sampling(24, repetition_penalty=1.5)
    openai = Sampling(24, frequency_penalty=1.5, presence_penalty=0.5)
    asks = [(p, plain) for p in prompts[:4]] + [(prompts[4], repeat), (prompts[5], openai)]
    start = threading.Barrier(len(asks))

    def one(ask: tuple[list[int], Sampling]) -> list[int]:
        start.wait()  # all at once: they share the batch
        return _tokens(engine, *ask)

    with ThreadPoolExecutor(len(asks)) as pool:
        results = list(pool.map(one, asks))
    for prompt, tokens in zip(prompts[:4], results, strict=False):
        assert tokens == generate_alone(model, prompt, 24)
    penalised = _generate(model, prompts[4], 24, repetition_penalty=1.5)
    assert results[4] == penalised
    assert penalised != generate_alone(model, prompts[4], 24), "the penalty changed nothing"
    expected = _greedy_openai(model, prompts[5], 24, 1.5, 0.5)
    assert results[5] == expected
    assert expected != generate_alone(model, prompts[5], 24), "the penalties changed nothing"
    assert engine.peak_active > 1, "the requests never shared a batch"


def test_a_logit_bias_steers_greedy_and_leaves_the_requests_beside_it(
    model: Any, engine: Engine
) -> None:
    prompts = _prompts()
    alone = generate_alone(model, prompts[1], 12)
    forced = Sampling(12, logit_bias=((42, 100.0),))
    banned = Sampling(12, logit_bias=tuple((t, -100.0) for t in set(alone)))
    asks = [(prompts[0], Sampling(12)), (prompts[1], forced), (prompts[1], banned)]
    with ThreadPoolExecutor(len(asks)) as pool:
        plain, all_42, other = pool.map(lambda ask: _tokens(engine, *ask), asks)
    assert plain == generate_alone(model, prompts[0], 12)
    assert all_42 == [42] * 12
    assert other and not set(other) & set(alone), "a banned token was made"


def test_a_logit_bias_outside_the_vocabulary_is_refused_before_the_batch(engine: Engine) -> None:
    from worker.llm.engine import EngineError

    with pytest.raises(EngineError, match="outside this model's vocabulary"):
        _tokens(engine, [1, 2, 3], Sampling(4, logit_bias=((VOCAB, 1.0),)))
    assert _tokens(engine, [1, 2, 3], Sampling(4)), "the engine serves on"


def test_min_p_one_leaves_only_the_most_likely_token(model: Any, engine: Engine) -> None:
    prompt = _prompts()[2]
    sampled = Sampling(16, temperature=1.5, min_p=1.0)
    assert _tokens(engine, prompt, sampled) == generate_alone(model, prompt, 16)
