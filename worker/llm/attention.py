"""Attention for the engine's eager steps under a mask of the step's own size.

transformers' continuous batching packs a step's sequences into one row of queries and
one row of the keys and values each reads from the paged cache. With ``sdpa`` it keeps
a dense float mask of ``max_batch_tokens`` by (every token the cache holds +
``max_batch_tokens``) per layer type, fills all of it when the batch starts, and at each
step refills the step's corner and writes each sequence's block into it, one sequence
at a time in Python. The mask's size follows the cache, not the model: a 256 MB cache of
a small model holds 524,288 tokens, so its mask is 1 GiB of fp32.

``packed_sdpa`` makes the step's mask instead, ``[query tokens, key tokens]`` of
booleans, from the step's cumulative lengths (``cu_seq_lens_q``/``cu_seq_lens_k``) in a
few tensor operations (``step_mask``): a query sees the keys of its own sequence up to
its place, within the layer's sliding window if it has one, the rule of the library's
``build_attention_mask``. It is made for a step's first layer and kept for the others.
``use_step_masks(model)`` turns it on for a model's engine, and the library then keeps
no dense mask for it.

Only for steps that run eagerly, unless asked (``Engine(step_masks_in_graphs=True)``, a
trial not yet measured on a GPU): a CUDA graph replays the library's own masked step.
Figures: bench/README.md, "The dense attention mask".

A layer whose scores are more than a mask describes is computed here in full, as the
model's own eager attention computes it (``scores_attention``): a cap on its scores
(``softcap``, Gemma 2's ``attn_logit_softcapping``: ``tanh(s / cap) * cap`` before the
mask) and attention sinks (``s_aux``, gpt-oss: one more logit per head that takes its
share of the softmax and no value). Such models refuse ``sdpa`` in transformers and are
loaded with ``eager``, which continuous batching runs as ``paged|eager``; the library's
``paged|eager`` ignores ``softcap``, so its steps come here too, under its own mask when
step masks are off.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch

# The configs of the models whose engines make each step's mask, by id (a config is not
# hashable; its attributes would be saved with it).
_step_masked: dict[int, weakref.ref[Any]] = {}
# What a layer may pass that changes its scores beyond a mask and is not applied here
# (an encoder's relative position bias).
_UNSUPPORTED = ("position_bias",)
# The attention implementations whose continuous-batching steps come here.
STEP_MASKED = ("sdpa", "eager", "paged|eager")
_installed = threading.Lock()
_originals: dict[str, Callable[..., Any]] = {}


class _StepMasks(threading.local):
    """The last step's masks in this thread, one per sliding window (None: full
    attention), each with what it was made for: every layer of a step (of a layer type)
    gets the same cumulative-length tensors, a new step new ones."""

    def __init__(self) -> None:
        self.by_window: dict[int | None, tuple[tuple[Any, ...], torch.Tensor]] = {}


_step_masks = _StepMasks()


def step_mask(
    cu_q: torch.Tensor, cu_k: torch.Tensor, q_tokens: int, k_tokens: int, window: int | None
) -> torch.Tensor:
    """``[q_tokens, k_tokens]``, True where a query may see a key: a key of its own
    sequence, at or before the query's place (the sequence's last query is its last key),
    within ``window`` keys if given. A query after the last sequence (padding) sees the
    first key only, so that no row is all masked (NaN)."""
    device = cu_q.device
    cu_q, cu_k = cu_q.long(), cu_k.long()
    sequences = cu_q.numel() - 1
    tq = torch.arange(q_tokens, device=device)
    tk = torch.arange(k_tokens, device=device)
    seq_q = torch.searchsorted(cu_q[1:], tq, right=True)  # == sequences: a padded query
    seq_k = torch.searchsorted(cu_k[1:], tk, right=True)
    # Per sequence, with one more entry for the padding's index.
    starts_q = torch.cat([cu_q[:-1], cu_q[-1:]])
    starts_k = torch.cat([cu_k[:-1], cu_k[-1:]])
    behind = torch.cat([(cu_k[1:] - cu_k[:-1]) - (cu_q[1:] - cu_q[:-1]), cu_q.new_zeros(1)])
    place = behind[seq_q] + tq - starts_q[seq_q]  # the query's place among its keys
    at = tk - starts_k[seq_k]  # the key's place in its sequence
    mask = (seq_q[:, None] == seq_k[None, :]) & (at[None, :] <= place[:, None])
    if window:
        mask &= at[None, :] > place[:, None] - int(window)
    padded = (seq_q == sequences)[:, None]
    return torch.where(padded, (tk == 0)[None, :], mask)


def packed_sdpa(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """``scaled_dot_product_attention`` over a continuous-batching step's packed
    sequences, each query on its own sequence's keys. ``query`` is
    ``[1, heads, q_tokens, dim]`` and ``key``/``value`` ``[1, kv_heads, k_tokens, dim]``,
    packed by ``cu_seq_lens_q``/``cu_seq_lens_k`` (fake sequences of length 0 and padded
    tokens after the last sequence allowed); returns ``[1, q_tokens, heads, dim]`` as
    transformers' attention functions do. The mask (``step_mask``) is made once a step
    and sliding window, for its first layer, and kept for the others. A layer passing
    ``softcap`` or ``s_aux`` is computed by ``scores_attention``."""
    if named := [name for name in _UNSUPPORTED if kwargs.get(name) is not None]:
        raise ValueError(f"step masks do not apply {', '.join(named)} to attention scores")
    mask = _step_mask_for(query, key, kwargs)
    softcap, sinks = kwargs.get("softcap"), kwargs.get("s_aux")
    if softcap is not None or sinks is not None:
        out = scores_attention(query, key, value, mask, scaling, softcap, sinks)
        return out, None
    groups = query.shape[1] // key.shape[1]
    gqa = groups > 1 and query.device.type == "cpu"
    if groups > 1 and not gqa:
        # CUDA's fused kernels take a mask only with the heads repeated (as transformers'
        # sdpa does); grouped with a mask, they fall back to the math kernel.
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    out = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=mask,
        dropout_p=dropout,
        scale=scaling,
        enable_gqa=gqa,  # on the CPU: no copy of the keys and values per head
    )
    return out.transpose(1, 2), None


def _step_mask_for(query: torch.Tensor, key: torch.Tensor, kwargs: dict[str, Any]) -> torch.Tensor:
    """The step's mask for this layer's window: kept from the step's first layer, or made."""
    cu_q, cu_k = kwargs["cu_seq_lens_q"], kwargs["cu_seq_lens_k"]
    window = kwargs.get("sliding_window")
    shape = (query.shape[2], key.shape[2], window)
    # The same tensors, unchanged since (in-place writes move a tensor's version): the
    # same step. Kept, they hold the tensors, so their ids are not reused meanwhile.
    made_for = (cu_q, cu_k, cu_q._version, cu_k._version, *shape)
    kept = _step_masks.by_window.get(window)
    if query.is_cuda and torch.cuda.is_current_stream_capturing():
        # A CUDA graph records each layer's mask from the step's inputs, so that its
        # replays make their own; a mask kept from outside the graph would be replayed.
        return step_mask(cu_q, cu_k, *shape)
    if kept is None or not _same(kept[0], made_for):
        mask = step_mask(cu_q, cu_k, *shape)
        _step_masks.by_window[window] = (made_for, mask)
        return mask
    return kept[1]


def scores_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float | None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention with its scores made in full, as a model's eager attention makes them:
    ``query @ key`` scaled, capped by ``softcap`` (``tanh(s / cap) * cap``), under
    ``mask`` (boolean: True where a query may see a key; or additive floats), with one
    more logit a head from ``sinks`` that takes a share of the softmax and gives no
    value; the softmax in fp32. Shapes as ``packed_sdpa``'s; returns
    ``[1, q_tokens, heads, dim]``."""
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    scores = torch.matmul(query, key.transpose(2, 3)) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if mask is not None and mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    elif mask is not None:
        scores = scores + mask
    if sinks is not None:
        sink = sinks.reshape(1, -1, 1, 1).expand(*scores.shape[:-1], 1).to(scores.dtype)
        scores = torch.cat([scores, sink], dim=-1)
        scores = scores - scores.amax(dim=-1, keepdim=True)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
    if sinks is not None:
        weights = weights[..., :-1]  # the sink's share, given to no value
    return torch.matmul(weights, value).transpose(1, 2).contiguous()


def _same(made_for: tuple[Any, ...], step: tuple[Any, ...]) -> bool:
    return made_for[0] is step[0] and made_for[1] is step[1] and made_for[2:] == step[2:]


def _sdpa(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, Any]:
    """transformers' ``sdpa``, except for a continuous-batching step with no mask: a
    step of a model ``use_step_masks`` was given (the library built no mask, and
    packed sequences must not see each other)."""
    if attention_mask is None and kwargs.get("cu_seq_lens_q") is not None:
        kwargs.pop("is_causal", None)
        return packed_sdpa(module, query, key, value, None, **kwargs)
    return _originals["sdpa"](module, query, key, value, attention_mask, **kwargs)


def _paged_eager(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, Any]:
    """transformers' ``paged|eager`` (continuous batching of a model loaded with
    ``eager``): a step with no mask as ``_sdpa``'s; a layer that caps its scores or has
    sinks under the library's mask by ``scores_attention``, since the library's ignores
    ``softcap``."""
    if attention_mask is None and kwargs.get("cu_seq_lens_q") is not None:
        kwargs.pop("is_causal", None)
        return packed_sdpa(module, query, key, value, None, scaling=scaling, **kwargs)
    softcap, sinks = kwargs.get("softcap"), kwargs.get("s_aux")
    if softcap is not None or sinks is not None:
        out = scores_attention(query, key, value, attention_mask, scaling, softcap, sinks)
        return out, None
    return _originals["paged|eager"](module, query, key, value, attention_mask, scaling, **kwargs)


def _install() -> None:
    """Once per process: ``_sdpa`` as transformers' ``sdpa`` and ``_paged_eager`` as its
    ``paged|eager``, and no dense mask kept for a model that ``use_step_masks`` was
    given."""
    with _installed:
        if _originals:
            return
        from transformers import AttentionInterface
        from transformers.generation.continuous_batching import input_outputs
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        _originals["sdpa"] = ALL_ATTENTION_FUNCTIONS["sdpa"]
        _originals["paged|eager"] = ALL_ATTENTION_FUNCTIONS["paged|eager"]
        needed = input_outputs.attn_mask_is_needed

        def mask_needed(config: Any) -> bool:
            return not uses_step_masks(config) and bool(needed(config))

        input_outputs.attn_mask_is_needed = mask_needed
        AttentionInterface.register("sdpa", _sdpa)
        AttentionInterface.register("paged|eager", _paged_eager)


def uses_step_masks(config: Any) -> bool:
    """Whether the model of ``config`` was given ``use_step_masks``."""
    ref = _step_masked.get(id(config))
    return ref is not None and ref() is config


def use_step_masks(model: Any, on: bool = True) -> bool:
    """Whether ``model``'s continuous-batching steps make their own masks
    (``packed_sdpa``) from its next batch on: only with ``sdpa`` or ``eager``; otherwise
    the library's own way is kept, and False. A model with ``eager`` gets
    ``_paged_eager`` either way, for the scores the library's would not cap."""
    config = model.config
    if config._attn_implementation not in STEP_MASKED:
        on = False
    else:
        _install()
    key = id(config)
    if not on:
        _step_masked.pop(key, None)
        return False

    def dropped(ref: weakref.ref[Any]) -> None:
        if _step_masked.get(key) is ref:
            del _step_masked[key]

    _step_masked[key] = weakref.ref(config, dropped)
    return True
