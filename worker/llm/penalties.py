"""Penalties, a logit bias and ``min_p`` per request inside one continuous batch, as
vLLM applies them and as clients send them: OpenAI's ``logit_bias``,
``presence_penalty`` and ``frequency_penalty``, and the ``repetition_penalty`` and
``min_p`` of vLLM and of models' ``generation_config.json`` (Qwen2.5 Instruct ships
``repetition_penalty`` 1.05).

Both are logits processors of transformers' own per-request kind
(``ContinuousBatchingLogitsProcessor``), placed around its warpers::

    logits ─ Penalties ─ temperature ─ top-k ─ top-p ─ MinP ─ SeededDraw ─ sample

``Penalties``, first, on the raw logits (where vLLM and ``model.generate`` put them, so
greedy with a penalty is ``generate``'s greedy with it), for each token ``t``:

    logit bias  l += the bias the request gives t (vLLM's order: before the penalties)
    repetition  t in the prompt or the output: a logit l > 0 becomes l / r, else l * r
    frequency   l -= frequency_penalty * (times t is in the output)
    presence    l -= presence_penalty  * (1 if t is in the output)

``MinP`` drops every token whose probability is below ``min_p`` times the most likely
one's (``MinPLogitsWarper`` with one token kept).

A step's per-row arguments are one number each, and a penalty needs each row's tokens:
``Penalties`` reads them from the request states when the step is prepared (the
generation loop runs each step it prepares before preparing the next; asynchronous
batching, which prepares a step before the last one's tokens are known, stays off in
``worker.llm.engine``), keeps them for the step, and its argument row only says which
rows have any. Eager steps touch the penalised rows' tokens only (a gather and a
scatter); a step without a penalised row costs one dict lookup per request. A captured
step (accelerator graphs, ``torch.compile``) cannot take a new number of tokens each
time, so there the penalties are three dense buffers of ``max rows x vocabulary``
floats, filled when the step is prepared and applied by every step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers.generation.continuous_batching.cb_logits_processors import (
    ContinuousBatchingLogitsProcessor,
)

from worker.llm.seeded import steps_captured

PENALTY_KWARGS = ("repetition_penalty", "frequency_penalty", "presence_penalty")
# A request's logit bias, as add_request takes it: ((token id, bias), ...)
BIAS_KWARG = "logit_bias"


def prompt_and_output(state: Any) -> tuple[list[int], list[int]]:
    """A request state's prompt tokens and the tokens it generated. A request that
    transformers reset to free its cache (``create_equivalent_initial_request``) holds
    its earlier output at the end of its initial tokens."""
    true_prompt = state._true_initial_tokens
    if true_prompt:
        prompt = state.initial_tokens[:true_prompt]
        return prompt, state.initial_tokens[true_prompt:] + state.generated_tokens
    return state.initial_tokens, state.generated_tokens


@dataclass(frozen=True)
class StepPenalties:
    """What one step's penalised rows change, as flat index lists (row, token):
    ``bias_*`` each token a row's logit bias names and the bias added;
    ``repeat_*`` each token a repetition penalty divides or multiplies, once per row;
    ``subtract_*`` each token of a row's output and the amount taken off its logit."""

    bias_rows: torch.Tensor
    bias_tokens: torch.Tensor
    bias_values: torch.Tensor
    repeat_rows: torch.Tensor
    repeat_tokens: torch.Tensor
    repeat_factors: torch.Tensor
    subtract_rows: torch.Tensor
    subtract_tokens: torch.Tensor
    subtract_amounts: torch.Tensor


def step_penalties(kwargs_by_row: list[dict[str, Any]], states: list[Any]) -> StepPenalties | None:
    """The changes of the rows whose kwargs name a penalty or a bias (None: no row does)."""
    bias: list[tuple[int, torch.Tensor, torch.Tensor]] = []
    repeat: list[tuple[int, torch.Tensor, float]] = []
    subtract: list[tuple[int, torch.Tensor, torch.Tensor]] = []
    for row, (kwargs, state) in enumerate(zip(kwargs_by_row, states, strict=True)):
        pairs = kwargs.get(BIAS_KWARG)
        if pairs:
            tokens = torch.tensor([t for t, _ in pairs], dtype=torch.long)
            bias.append((row, tokens, torch.tensor([b for _, b in pairs], dtype=torch.float32)))
        repetition = float(kwargs.get("repetition_penalty", 1.0))
        frequency = float(kwargs.get("frequency_penalty", 0.0))
        presence = float(kwargs.get("presence_penalty", 0.0))
        if repetition == 1.0 and frequency == 0.0 and presence == 0.0:
            continue
        prompt, output = prompt_and_output(state)
        if repetition != 1.0:
            seen = torch.tensor(prompt + output, dtype=torch.long).unique()
            repeat.append((row, seen, repetition))
        if (frequency or presence) and output:
            tokens, counts = torch.tensor(output, dtype=torch.long).unique(return_counts=True)
            subtract.append((row, tokens, frequency * counts.float() + presence))
    if not bias and not repeat and not subtract:
        return None

    def rows_of(parts: list[Any]) -> torch.Tensor:
        sizes = [part[1].numel() for part in parts]
        return torch.repeat_interleave(torch.tensor([p[0] for p in parts]), torch.tensor(sizes))

    empty = torch.empty(0, dtype=torch.long)
    return StepPenalties(
        bias_rows=rows_of(bias) if bias else empty,
        bias_tokens=torch.cat([p[1] for p in bias]) if bias else empty,
        bias_values=torch.cat([p[2] for p in bias]) if bias else torch.empty(0),
        repeat_rows=rows_of(repeat) if repeat else empty,
        repeat_tokens=torch.cat([p[1] for p in repeat]) if repeat else empty,
        repeat_factors=(
            torch.cat([torch.full((p[1].numel(),), p[2]) for p in repeat])
            if repeat
            else torch.empty(0)
        ),
        subtract_rows=rows_of(subtract) if subtract else empty,
        subtract_tokens=torch.cat([p[1] for p in subtract]) if subtract else empty,
        subtract_amounts=torch.cat([p[2] for p in subtract]) if subtract else torch.empty(0),
    )


def apply_sparse(scores: torch.Tensor, step: StepPenalties) -> torch.Tensor:
    """``scores`` [rows, vocab] with the step's penalties applied (a new tensor)."""
    device = scores.device
    scores = scores.clone()
    if step.bias_rows.numel():
        index = (step.bias_rows.to(device), step.bias_tokens.to(device))
        scores.index_put_(index, step.bias_values.to(device), accumulate=True)
    if step.repeat_rows.numel():
        index = (step.repeat_rows.to(device), step.repeat_tokens.to(device))
        values = scores[index]
        factors = step.repeat_factors.to(device)
        scores[index] = torch.where(values > 0, values / factors, values * factors)
    if step.subtract_rows.numel():
        index = (step.subtract_rows.to(device), step.subtract_tokens.to(device))
        scores.index_put_(index, -step.subtract_amounts.to(device), accumulate=True)
    return scores


class Penalties(ContinuousBatchingLogitsProcessor):
    """Applies each request's penalties (see the module docstring). ``dense_rows``: the
    most rows a step has, for captured steps (their three buffers); None: eager steps."""

    supported_kwargs: dict[str, type] = {
        **{name: float for name in PENALTY_KWARGS},
        BIAS_KWARG: tuple,
    }
    ignored_kwargs: tuple[str, ...] = ()

    def __init__(self, dense_rows: int | None, vocab_size: int, device: torch.device) -> None:
        self._step: StepPenalties | None = None  # set when a step is prepared
        self._dense: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._dense_dirty = False
        if dense_rows is not None:
            self._dense = (
                torch.zeros(dense_rows, vocab_size, device=device),  # biases added
                torch.ones(dense_rows, vocab_size, device=device),  # repetition factors
                torch.zeros(dense_rows, vocab_size, device=device),  # amounts taken off
            )

    def fill_defaults(self, int32_tensor: torch.Tensor) -> None:
        int32_tensor.zero_()

    def prepare_tensor_args(self, requests_with_new_token: list[Any]) -> torch.Tensor:
        states = [request.state for request in requests_with_new_token]
        kwargs = [state.logit_processor_kwargs for state in states]
        penalised = [any(name in k for name in (*PENALTY_KWARGS, BIAS_KWARG)) for k in kwargs]
        self._step = step_penalties(kwargs, states) if any(penalised) else None
        if self._dense is not None:
            self._fill_dense()
        return torch.tensor(penalised, dtype=torch.int32)

    def _fill_dense(self) -> None:
        assert self._dense is not None
        biases, factors, amounts = self._dense
        if self._dense_dirty:
            biases.zero_()
            factors.fill_(1.0)
            amounts.zero_()
            self._dense_dirty = False
        step = self._step
        if step is None:
            return
        device = factors.device
        if step.bias_rows.numel():
            index = (step.bias_rows.to(device), step.bias_tokens.to(device))
            biases.index_put_(index, step.bias_values.to(device))
        if step.repeat_rows.numel():
            index = (step.repeat_rows.to(device), step.repeat_tokens.to(device))
            factors.index_put_(index, step.repeat_factors.to(device))
        if step.subtract_rows.numel():
            index = (step.subtract_rows.to(device), step.subtract_tokens.to(device))
            amounts.index_put_(index, step.subtract_amounts.to(device))
        self._dense_dirty = True

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        if self._dense is not None:
            rows = scores.size(0)
            biases, factors, amounts = (buffer[:rows] for buffer in self._dense)
            scores = scores + biases
            return torch.where(scores > 0, scores / factors, scores * factors) - amounts
        if self._step is None:
            return scores
        return apply_sparse(scores, self._step)


def min_p_rows(scores: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """``scores`` with each row's tokens below ``min_p`` times its top probability at
    -inf (a row at 0 unchanged; its most likely token always stays)."""
    probs = scores.softmax(dim=-1)
    threshold = min_p.unsqueeze(-1) * probs.amax(dim=-1, keepdim=True)
    return scores.masked_fill(probs < threshold, float("-inf"))


class MinP(ContinuousBatchingLogitsProcessor):
    """Each request's ``min_p`` (0: off). ``every_step``: run even when no row of the
    step sets one (captured steps)."""

    supported_kwargs: dict[str, type] = {"min_p": float}
    ignored_kwargs: tuple[str, ...] = ()

    def __init__(self, every_step: bool) -> None:
        self.every_step = every_step
        self._in_step = False

    def fill_defaults(self, int32_tensor: torch.Tensor) -> None:
        int32_tensor.copy_(torch.zeros_like(int32_tensor, dtype=torch.float32).view(torch.int32))

    def prepare_tensor_args(self, requests_with_new_token: list[Any]) -> torch.Tensor:
        values = [
            float(request.state.logit_processor_kwargs.get("min_p", 0.0))
            for request in requests_with_new_token
        ]
        self._in_step = any(values)
        return torch.tensor(values, dtype=torch.float32).view(dtype=torch.int32)

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        if not (self.every_step or self._in_step):
            return scores
        return min_p_rows(scores, tensor_arg[: scores.size(0)].view(dtype=torch.float32))


def install_penalties(manager: Any, vocab_size: int, device: torch.device) -> None:
    """Puts ``Penalties`` first in ``manager``'s logits processors and ``MinP`` after its
    warpers, so requests may pass the penalties and ``min_p`` to ``add_request``. Call
    it between ``init_continuous_batching`` and ``start``, before ``install_seeded_draw``
    (which goes last): the manager sizes its argument tensors when it starts."""
    if manager.batch_processor is not None:
        raise RuntimeError("install the penalties before the manager starts")
    captured = steps_captured(manager)
    dense_rows = manager.continuous_batching_config.max_requests_per_batch if captured else None
    penalties = Penalties(dense_rows, vocab_size, device)
    min_p = MinP(every_step=captured)
    processors = manager.logit_processor
    processors.logits_processor.insert(0, penalties)
    processors.logits_processor.append(min_p)
    processors.tensors_required += 2
    processors.supported_keys.update(penalties.supported_kwargs)
    processors.supported_keys.update(min_p.supported_kwargs)
    processors.do_processing = True
