"""Log probabilities per output token inside one continuous batch, as OpenAI's
``logprobs`` / ``top_logprobs`` (chat) and ``logprobs`` (completions) return them:
for each token a request makes, its log probability and those of the ``n`` most
likely tokens at that position (0 to ``MAX_TOP_LOGPROBS``).

They are the model's own distribution, the log-softmax of the raw logits, before any
penalty, temperature, top-k, top-p or ``min_p`` (vLLM's default, ``raw_logprobs``):
what the model thinks of the token, whatever the sampling, and the same for a greedy
and a sampled request. transformers' own ``return_logprobs`` gives the drawn token's
only, after processing (so 0 for a greedy one), and for every request of the batch.

``StepLogprobs`` is a logits processor of transformers' per-request kind, placed first::

    step prepared   prepare_tensor_args: which rows' requests ask for logprobs, and how
                    many alternatives each
    logits          StepLogprobs keeps those rows as they are ─ Penalties ─ warpers ─ ...
    sampled         the step's tokens are in the runner's output ids
    after the step  collect(output ids): per asking row, its token's log probability and
                    the top n, to the host (the engine hands them over with the tokens)

An eager step keeps the asking rows only (a gather); a step without one costs a dict
lookup per request. A captured step (accelerator graphs, ``torch.compile``) cannot
choose its rows, so it copies every row into a buffer of ``max rows x vocabulary``
floats; the log-softmax and the top n run after it, outside the graph, for the asking
rows only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers.generation.continuous_batching.cb_logits_processors import (
    ContinuousBatchingLogitsProcessor,
)

from worker.llm.seeded import steps_captured

MAX_TOP_LOGPROBS = 20  # alternatives per token (OpenAI's limit for chat; vLLM's default)


@dataclass(frozen=True)
class TokenLogprob:
    """One made token's log probability, and the ``n`` most likely tokens at its
    position with theirs, most likely first (the token itself among them if it was)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class _AskingRow:
    row: int  # of the step's rows (requests with a new token), in packing order
    request_id: str
    top: int


def asking_rows(requests_with_new_token: list[Any]) -> list[_AskingRow]:
    """The step's rows whose requests asked for logprobs."""
    out = []
    for row, request in enumerate(requests_with_new_token):
        top = request.state.logit_processor_kwargs.get("logprobs")
        if top is not None:
            out.append(_AskingRow(row, request.state.request_id, int(top)))
    return out


def token_logprobs(raw: torch.Tensor, tokens: torch.Tensor, tops: list[int]) -> list[TokenLogprob]:
    """For each row of ``raw`` logits [rows, vocab], the log probability of its row of
    ``tokens`` and its ``tops[i]`` most likely tokens."""
    logp = raw.float().log_softmax(dim=-1)
    chosen = logp.gather(1, tokens.view(-1, 1).to(logp.device)).squeeze(1).tolist()
    most = min(max(tops, default=0), logp.size(-1))
    top_values: list[list[float]] = [[] for _ in tops]
    top_ids: list[list[int]] = [[] for _ in tops]
    if most:
        values, ids = logp.topk(most, dim=-1)
        top_values, top_ids = values.tolist(), ids.tolist()
    return [
        TokenLogprob(int(token), float(logprob), tuple(zip(ids_, values_, strict=True))[:top])
        for token, logprob, ids_, values_, top in zip(
            tokens.tolist(), chosen, top_ids, top_values, tops, strict=True
        )
    ]


class StepLogprobs(ContinuousBatchingLogitsProcessor):
    """Keeps the raw logits of the rows asking for logprobs (see the module docstring).
    ``dense_rows``: the most rows a step has, for captured steps (their buffer); None:
    eager steps. The generation loop runs each step it prepares before preparing the
    next, so what ``prepare_tensor_args`` notes is the step ``collect`` follows."""

    supported_kwargs: dict[str, type] = {"logprobs": int}
    ignored_kwargs: tuple[str, ...] = ()

    def __init__(self, dense_rows: int | None, vocab_size: int, device: torch.device) -> None:
        self._asking: list[_AskingRow] = []
        self._rows: torch.Tensor | None = None  # the asking rows' indices, on the device
        self._kept: torch.Tensor | None = None  # eager: their raw logits
        self._dense: torch.Tensor | None = None
        if dense_rows is not None:
            self._dense = torch.zeros(dense_rows, vocab_size, device=device)
        self._device = device

    def fill_defaults(self, int32_tensor: torch.Tensor) -> None:
        int32_tensor.zero_()

    def prepare_tensor_args(self, requests_with_new_token: list[Any]) -> torch.Tensor:
        self._asking = asking_rows(requests_with_new_token)
        self._kept = None
        self._rows = None
        if self._asking:
            rows = [a.row for a in self._asking]
            self._rows = torch.tensor(rows, dtype=torch.long, device=self._device)
        asks = [0] * len(requests_with_new_token)
        for asking in self._asking:
            asks[asking.row] = 1
        return torch.tensor(asks, dtype=torch.int32)

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        if self._dense is not None:
            self._dense[: scores.size(0)].copy_(scores)
        elif self._rows is not None:
            self._kept = scores.index_select(0, self._rows)
        return scores

    def collect(self, sampled: torch.Tensor) -> list[tuple[str, TokenLogprob]]:
        """After the step's sampling: each asking request's id and its token's
        logprobs. ``sampled``: the step's tokens, one per row (the runner's output ids)."""
        asking, rows = self._asking, self._rows
        self._asking, self._rows = [], None
        if not asking or rows is None:
            return []
        kept, self._kept = self._kept, None
        raw = self._dense.index_select(0, rows) if self._dense is not None else kept
        if raw is None:  # the step's processing did not run (it failed before)
            return []
        tokens = sampled.index_select(0, rows.to(sampled.device))
        made = token_logprobs(raw, tokens, [a.top for a in asking])
        return [(a.request_id, m) for a, m in zip(asking, made, strict=True)]


def install_logprobs(manager: Any, vocab_size: int, device: torch.device) -> StepLogprobs:
    """Puts ``StepLogprobs`` first in ``manager``'s logits processors (before the
    penalties: it keeps the raw logits), so requests may pass ``logprobs=n`` to
    ``add_request``. Call it between ``init_continuous_batching`` and ``start``, after
    ``install_penalties`` (which also goes first); each step's ``collect`` is the
    caller's to run, after the step's forward (``engine.install_step_guard``)."""
    if manager.batch_processor is not None:
        raise RuntimeError("install the logprobs before the manager starts")
    captured = steps_captured(manager)
    dense_rows = manager.continuous_batching_config.max_requests_per_batch if captured else None
    kept = StepLogprobs(dense_rows, vocab_size, device)
    processors = manager.logit_processor
    processors.logits_processor.insert(0, kept)
    processors.tensors_required += 1
    processors.supported_keys.update(kept.supported_kwargs)
    processors.do_processing = True
    return kept
