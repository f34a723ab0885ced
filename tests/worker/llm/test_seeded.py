"""The seeded draw on its own: the inverse CDF picks tokens in proportion to their
probability and never a filtered one; rows without a seed are left to the sampler;
the processor does nothing in a step without a seeded request."""

from __future__ import annotations

import torch
from transformers.generation.continuous_batching.requests import (
    FutureRequestState,
    RequestState,
)

from worker.llm.seeded import SeededDraw, draw_rows, uniform

NEG_INF = float("-inf")


def test_the_draw_follows_the_probabilities_and_skips_filtered_tokens() -> None:
    probs = torch.tensor([0.1, 0.0, 0.6, 0.3])  # token 1 filtered (top-k / top-p)
    scores = probs.log().expand(1000, 4).contiguous()
    grid = torch.arange(1000, dtype=torch.float32) / 1000  # uniforms evenly over [0, 1)
    drawn = draw_rows(scores, grid)
    tokens = drawn.argmax(dim=-1)
    assert torch.equal(drawn.softmax(dim=-1).max(dim=-1).values, torch.ones(1000))  # one-hot
    counts = torch.bincount(tokens, minlength=4).tolist()
    assert counts[1] == 0
    assert all(abs(c - 1000 * p) < 2 for c, p in zip(counts, probs.tolist(), strict=True))


def test_rows_without_a_seed_are_left_as_they_are() -> None:
    scores = torch.randn(3, 16)
    drawn = draw_rows(scores, torch.tensor([-1.0, 0.5, -1.0]))
    assert torch.equal(drawn[0], scores[0]) and torch.equal(drawn[2], scores[2])
    assert (drawn[1] == 0).sum() == 1 and (drawn[1] == NEG_INF).sum() == 15


def test_the_uniform_depends_on_the_seed_and_position_only() -> None:
    draws = {uniform(seed, position) for seed in (0, 1, 2**63 - 1) for position in range(50)}
    assert len(draws) == 150 and all(0 <= u < 1 for u in draws)
    assert uniform(7, 3) == uniform(7, 3)


def _request(request_id: str, seed: int | None, position: int) -> FutureRequestState:
    state = RequestState(
        request_id=request_id,
        initial_tokens=[1] * position,
        logit_processor_kwargs={} if seed is None else {"seed": seed},
    )
    state.position_offset = position
    return FutureRequestState(state, has_new_token=True, complete_blocks={}, query_length=1)


def test_the_processor_draws_only_for_seeded_requests() -> None:
    draw = SeededDraw(every_step=False)
    scores = torch.randn(2, 16)
    args = draw.prepare_tensor_args([_request("a", None, 5), _request("b", 42, 9)])
    drawn = draw(scores, args)
    assert torch.equal(drawn[0], scores[0])
    assert torch.equal(drawn[1], draw_rows(scores[1:], torch.tensor([uniform(42, 9)]))[0])

    args = draw.prepare_tensor_args([_request("a", None, 6), _request("c", None, 3)])
    assert draw(scores, args) is scores  # a step without a seed costs nothing
