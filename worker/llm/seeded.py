"""A request's ``seed`` inside one continuous batch: the same seed, prompt and sampling
give the same tokens whatever else shares the batch and whenever the request joins.

transformers' continuous batching samples a whole step with one ``torch.multinomial``
over the global RNG (``ModelRunner._sample`` in ``continuous_batching/model_runner.py``),
so a row's draw depends on every row drawn before it. ``SeededDraw`` is a per-request
logits processor of transformers' own kind (``ContinuousBatchingLogitsProcessor``),
placed last, after temperature, top-k and top-p::

    step prepared   prepare_tensor_args: a seeded request gets u = uniform(seed, position
                    of the token it is about to draw); a request without one gets -1
    logits          temperature ─ top-k ─ top-p ─ SeededDraw: a row with u in [0, 1)
                    becomes one-hot on the token the inverse CDF of its probabilities
                    gives at u; a row with -1 is left as it is
    sampled         multinomial: certain on a one-hot row; random as before elsewhere

The uniform is counter-based (a hash of the seed and the token's position): the stream
a request draws from is indexed by its own tokens, never advanced by the steps around
it, so there is no per-request state to keep, to advance in the right order when
transformers prepares a step ahead (async batching), or to drop when a request ends or
is cancelled; the seed travels in the request's own state (``add_request(seed=...)``).

Cost: a step with no seeded row costs one dict lookup per request when it is prepared
(as each warper's own arguments do) and nothing on the logits, unless the manager runs
accelerator graphs or ``torch.compile`` (a captured step cannot branch on the batch):
then every step pays a softmax, a cumsum and a select over its rows. Requests forked by
transformers (``num_return_sequences``) would share the seed, and so the draws.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any

import torch
from transformers.generation.continuous_batching.cb_logits_processors import (
    ContinuousBatchingLogitsProcessor,
)

_NO_SEED = -1.0  # a row's argument when its request has no seed


def uniform(seed: int, position: int) -> float:
    """A number in [0, 1) that depends only on ``seed`` and ``position``. 24 bits: exact
    in float32, and below 1 there, so ``u * total < total`` (a token with mass is drawn)."""
    digest = hashlib.blake2b(struct.pack("<QQ", seed, position), digest_size=8).digest()
    return (int.from_bytes(digest, "little") >> 40) / (1 << 24)


def draw_rows(scores: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """``scores`` [rows, vocab] with each row whose uniform is in [0, 1) made one-hot
    (0 on the token drawn, -inf elsewhere) on the token the inverse CDF of
    ``softmax(row)`` gives at that uniform; rows whose uniform is negative unchanged."""
    cdf = scores.softmax(dim=-1).cumsum(dim=-1)
    thresholds = (uniforms.clamp(min=0) * cdf[:, -1]).unsqueeze(-1)
    # The first position whose cumulative mass passes the threshold. The clamp only
    # guards a scan whose float sums are not monotone; the one-hot is built, not cut
    # from the row, so even a token drawn there samples (never an all -inf row).
    tokens = torch.searchsorted(cdf, thresholds, right=True).clamp(max=scores.size(-1) - 1)
    one_hot = torch.full_like(scores, float("-inf")).scatter_(-1, tokens, 0.0)
    return torch.where((uniforms >= 0).unsqueeze(-1), one_hot, scores)


class SeededDraw(ContinuousBatchingLogitsProcessor):
    """Draws the token of every seeded request in a step (see the module docstring).
    ``every_step``: run even when no request of the step has a seed (graphs, compile)."""

    supported_kwargs: dict[str, type] = {"seed": int}
    ignored_kwargs: tuple[str, ...] = ()

    def __init__(self, every_step: bool) -> None:
        self.every_step = every_step
        # Set when a step is prepared, read when it runs: the generation loop runs each
        # step it prepares before preparing the next (async batching included).
        self._seeded_in_step = False

    def fill_defaults(self, int32_tensor: torch.Tensor) -> None:
        no_seed = torch.full_like(int32_tensor, _NO_SEED, dtype=torch.float32)
        int32_tensor.copy_(no_seed.view(dtype=torch.int32))

    def prepare_tensor_args(self, requests_with_new_token: list[Any]) -> torch.Tensor:
        # transformers advances position_offset past the step's tokens before this call,
        # so it is the position of the token each request draws now.
        uniforms = [_NO_SEED] * len(requests_with_new_token)
        for row, request in enumerate(requests_with_new_token):
            seed = request.state.logit_processor_kwargs.get("seed")
            if seed is not None:
                uniforms[row] = uniform(seed, request.state.position_offset)
        self._seeded_in_step = any(u >= 0 for u in uniforms)
        return torch.tensor(uniforms, dtype=torch.float32).view(dtype=torch.int32)

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        if not (self.every_step or self._seeded_in_step):
            return scores
        uniforms = tensor_arg[: scores.size(0)].view(dtype=torch.float32)
        return draw_rows(scores, uniforms)


def steps_captured(manager: Any) -> bool:
    """Whether ``manager``'s steps run as accelerator graphs or compiled: a processor
    then cannot branch on the step's requests (its work is the same every step)."""
    config = manager.continuous_batching_config
    return bool(
        any(config.cuda_graph_booleans)
        or config.varlen_compile_config is not None
        or config.decode_compile_config is not None
    )


def install_seeded_draw(manager: Any) -> SeededDraw:
    """Puts a ``SeededDraw`` last in ``manager``'s logits processors, so requests may
    pass ``seed=`` to ``add_request``. Call it between ``init_continuous_batching`` and
    ``start``: the manager sizes its per-step argument tensors from the processors when
    it starts."""
    if manager.batch_processor is not None:
        raise RuntimeError("install SeededDraw before the manager starts")
    draw = SeededDraw(every_step=steps_captured(manager))
    processors = manager.logit_processor
    processors.logits_processor.append(draw)  # last: it draws from what the warpers left
    # The bookkeeping transformers does for each processor it converts itself: one
    # argument row, and the kwarg accepted by add_request's check.
    processors.tensors_required += 1
    processors.supported_keys.update(draw.supported_kwargs)
    processors.do_processing = True
    return draw
