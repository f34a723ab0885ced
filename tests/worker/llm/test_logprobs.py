"""Log probabilities per token: the processor keeps the asking rows' raw logits and
nothing else; the dense form of captured steps gives the same; in the engine, the
logprobs a request gets are the model's own at each position (a full forward over its
prompt and tokens says so), for greedy and sampled, penalised requests alike, and the
requests beside them are untouched."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch
from transformers.generation.continuous_batching.requests import (
    FutureRequestState,
    RequestState,
)

from tests.worker.llm.test_engine import _prompts, generate_alone
from worker.llm.engine import Engine, Sampling, TokenStep
from worker.llm.logprobs import MAX_TOP_LOGPROBS, StepLogprobs, TokenLogprob, token_logprobs


def _request(request_id: str, **kwargs: int) -> FutureRequestState:
    state = RequestState(
        request_id=request_id, initial_tokens=[1, 2], logit_processor_kwargs=kwargs
    )
    return FutureRequestState(state, has_new_token=True, complete_blocks={}, query_length=1)


def _step(kept: StepLogprobs, scores: torch.Tensor, requests: list[FutureRequestState]) -> Any:
    args = kept.prepare_tensor_args(requests)
    out = kept(scores, args)
    return args, out


def test_the_asking_rows_get_their_tokens_logprob_and_top_n() -> None:
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(3, 50, generator=g) * 4
    requests = [_request("a", logprobs=3), _request("b"), _request("c", logprobs=0)]
    kept = StepLogprobs(None, 50, torch.device("cpu"))
    args, out = _step(kept, scores, requests)
    assert args.tolist() == [1, 0, 1]
    assert out is scores  # the logits go on as they came
    sampled = torch.tensor([7, 8, 9, 0], dtype=torch.int32)  # one per row, then padding
    made = kept.collect(sampled)

    assert [request_id for request_id, _ in made] == ["a", "c"]
    logp = scores.log_softmax(-1)
    a, c = made[0][1], made[1][1]
    assert a.token_id == 7 and a.logprob == pytest.approx(float(logp[0, 7]), abs=1e-6)
    top3 = logp[0].topk(3)
    assert [t for t, _ in a.top] == top3.indices.tolist()
    assert [v for _, v in a.top] == pytest.approx(top3.values.tolist(), abs=1e-6)
    assert c.token_id == 9 and c.top == ()
    assert c.logprob == pytest.approx(float(logp[2, 9]), abs=1e-6)
    assert kept.collect(sampled) == [], "a step's logprobs are handed over once"


def test_a_step_without_an_asking_row_keeps_nothing() -> None:
    kept = StepLogprobs(None, 16, torch.device("cpu"))
    args, _ = _step(kept, torch.randn(2, 16), [_request("a"), _request("b")])
    assert args.tolist() == [0, 0]
    assert kept._kept is None
    assert kept.collect(torch.tensor([1, 2])) == []


def test_the_dense_form_of_captured_steps_equals_the_eager_one() -> None:
    g = torch.Generator().manual_seed(3)
    scores = torch.randn(4, 40, generator=g)
    requests = [_request("a"), _request("b", logprobs=5), _request("c"), _request("d", logprobs=1)]
    sampled = torch.tensor([0, 11, 0, 39])
    eager = StepLogprobs(None, 40, torch.device("cpu"))
    dense = StepLogprobs(8, 40, torch.device("cpu"))
    _step(eager, scores, requests)
    _step(dense, scores, requests)
    assert dense.collect(sampled) == eager.collect(sampled)


def test_top_n_is_capped_by_the_vocabulary() -> None:
    made = token_logprobs(torch.zeros(1, 3), torch.tensor([1]), [MAX_TOP_LOGPROBS])
    assert len(made[0].top) == 3
    assert made[0].logprob == pytest.approx(-1.0986, abs=1e-4)  # log(1/3)


@pytest.mark.parametrize("bad", [-1, MAX_TOP_LOGPROBS + 1, 2.0, True])
def test_a_logprobs_count_out_of_range_is_refused(bad: Any) -> None:
    with pytest.raises(ValueError, match="logprobs must be an integer from 0 to 20"):
        Sampling(4, logprobs=bad)


def test_the_count_reaches_the_processors_only_when_asked() -> None:
    assert "logprobs" not in Sampling(4).processor_kwargs(32)
    assert Sampling(4, logprobs=0).processor_kwargs(32)["logprobs"] == 0


def test_steps_joined_keep_their_logprobs_in_order() -> None:
    one, two = TokenLogprob(1, -0.5), TokenLogprob(2, -1.5)
    joined = TokenStep([1], 0.0, logprobs=(one,)).then(TokenStep([2], 1.0, "length", None, (two,)))
    assert joined.token_ids == [1, 2] and joined.logprobs == (one, two)


# --- in the engine -------------------------------------------------------------


def _run(engine: Engine, prompt: list[int], sampling: Sampling) -> tuple[list[int], list[Any]]:
    tokens: list[int] = []
    logprobs: list[TokenLogprob] = []
    for step in engine.generate(prompt, sampling):
        tokens += step.token_ids
        logprobs += step.logprobs
    return tokens, logprobs


def _model_logprobs(model: Any, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """The model's log-softmax at each output position: one forward over the prompt
    and the tokens, as they were fed back."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens], device=model.device)).logits[0].float()
    return logits[len(prompt) - 1 : len(prompt) - 1 + len(tokens)].log_softmax(-1).cpu()


def test_logprobs_are_the_models_own_beside_requests_without_them(
    model: Any, engine: Engine
) -> None:
    prompts = _prompts()
    plain = Sampling(20)
    asks = [(p, plain) for p in prompts[:3]] + [
        (prompts[3], Sampling(20, logprobs=5)),  # greedy
        (prompts[4], Sampling(20, temperature=1.3, seed=7, repetition_penalty=1.3, logprobs=2)),
        (prompts[5], Sampling(20, logprobs=0)),
    ]
    start = threading.Barrier(len(asks))

    def one(ask: tuple[list[int], Sampling]) -> tuple[list[int], list[Any]]:
        start.wait()  # all at once: they share the batch
        return _run(engine, *ask)

    with ThreadPoolExecutor(len(asks)) as pool:
        results = list(pool.map(one, asks))
    for prompt, (tokens, logprobs) in zip(prompts[:3], results, strict=False):
        assert tokens == generate_alone(model, prompt, 20)
        assert logprobs == []
    assert results[3][0] == generate_alone(model, prompts[3], 20), "asking changed the tokens"
    for (prompt, sampling), (tokens, logprobs) in zip(asks[3:], results[3:], strict=True):
        assert [lp.token_id for lp in logprobs] == tokens
        expected = _model_logprobs(model, prompt, tokens)
        for position, lp in enumerate(logprobs):
            row = expected[position]
            assert lp.logprob == pytest.approx(float(row[lp.token_id]), abs=1e-4)
            top = row.topk(sampling.logprobs or 1)
            assert len(lp.top) == sampling.logprobs
            if lp.top:
                assert [t for t, _ in lp.top] == top.indices.tolist()
                assert [v for _, v in lp.top] == pytest.approx(top.values.tolist(), abs=1e-4)
    # greedy: each token is the most likely, so its logprob heads its top list
    assert all(lp.top[0] == (lp.token_id, pytest.approx(lp.logprob)) for lp in results[3][1])
    assert engine.peak_active > 1, "the requests never shared a batch"
