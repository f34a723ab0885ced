"""Attention for the engine's eager steps, sequence by sequence, with no dense mask.

transformers' continuous batching packs a step's sequences into one row of queries and
one row of the keys and values each reads from the paged cache. With ``sdpa`` it then
keeps a dense mask of ``max_batch_tokens`` by (every token the cache holds +
``max_batch_tokens``) per layer type, fills the step's corner of it every step, and
attends every query to every key of the step, its own sequence's or not. The mask's
size follows the cache, not the model: a 256 MB cache of a small model holds 524,288
tokens, so its mask is 1 GiB of fp32, written in full when the batch starts and refilled
in part at each step.

``varlen_sdpa`` attends each sequence's queries to its own keys instead: the packed rows
are gathered into a padded batch by the step's cumulative lengths
(``cu_seq_lens_q``/``cu_seq_lens_k``), one ``scaled_dot_product_attention`` runs with a
boolean mask of the batch's own size (causal from each sequence's last key, within the
layer's sliding window if it has one), and the outputs go back to their packed places.
The mask it replaces holds the same rule (``build_attention_mask``), so the outputs are
the same; ``use_varlen_attention(model)`` turns it on for a model's engine, and the
library then builds no dense mask for it.

Only for steps that run eagerly: its shapes follow each step's longest sequence, which a
CUDA graph, captured once for a padded shape, cannot follow. Figures: bench/README.md,
"Attention without the dense mask".
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

_FLAG = "_thaw_varlen_attention"  # on a model's config: its engine attends per sequence
_installed = threading.Lock()
_original_sdpa: Callable[..., Any] | None = None


def varlen_sdpa(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention over a continuous-batching step's packed sequences, each on its own
    keys. ``query`` is ``[1, heads, q_tokens, dim]`` and ``key``/``value``
    ``[1, kv_heads, k_tokens, dim]``, packed by ``cu_seq_lens_q``/``cu_seq_lens_k``
    (fake sequences of length 0 and padded tokens after the last sequence allowed);
    returns ``[1, q_tokens, heads, dim]`` as transformers' attention functions do
    (padded tokens' rows are zeros)."""
    cu_q, cu_k = kwargs["cu_seq_lens_q"], kwargs["cu_seq_lens_k"]
    max_q, max_k = int(kwargs["max_length_q"]), int(kwargs["max_length_k"])
    window = kwargs.get("sliding_window")
    device = query.device
    len_q, len_k = cu_q[1:] - cu_q[:-1], cu_k[1:] - cu_k[:-1]
    q_tokens = query.shape[2]
    iq = torch.arange(max_q, device=device)
    ik = torch.arange(max_k, device=device)
    valid_q = iq[None, :] < len_q[:, None]  # [batch, max_q]
    valid_k = ik[None, :] < len_k[:, None]  # [batch, max_k]
    at_q = torch.where(valid_q, cu_q[:-1, None] + iq[None, :], 0)
    at_k = torch.where(valid_k, cu_k[:-1, None] + ik[None, :], 0)
    q = query[0][:, at_q].transpose(0, 1)  # [batch, heads, max_q, dim]
    k = key[0][:, at_k].transpose(0, 1)
    v = value[0][:, at_k].transpose(0, 1)
    # A query's place among its sequence's keys: the last query is the last key.
    place = (len_k - len_q)[:, None] + iq[None, :]  # [batch, max_q]
    allowed = valid_k[:, None, :] & (ik[None, None, :] <= place[:, :, None])
    if window:
        allowed &= ik[None, None, :] > place[:, :, None] - int(window)
    # A padded query row attends to one key, so no row is all masked (NaN); it is dropped.
    allowed |= (~valid_q)[:, :, None] & (ik == 0)[None, None, :]
    out = torch.nn.functional.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=allowed[:, None],
        dropout_p=dropout,
        scale=scaling,
        enable_gqa=q.shape[1] != k.shape[1],
    )  # [batch, heads, max_q, dim]
    rows = out.transpose(1, 2).reshape(-1, out.shape[1], out.shape[3])
    to = torch.where(valid_q, at_q, q_tokens).reshape(-1)  # padded rows: one spare row
    packed = rows.new_zeros(q_tokens + 1, rows.shape[1], rows.shape[2])
    packed.index_copy_(0, to, rows)
    return packed[:q_tokens].unsqueeze(0), None


def _sdpa(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, Any]:
    """transformers' ``sdpa``, except for a continuous-batching step with no mask: a
    step of a model ``use_varlen_attention`` was given (the library built no mask, and
    packed sequences must not see each other)."""
    if attention_mask is None and kwargs.get("cu_seq_lens_q") is not None:
        kwargs.pop("is_causal", None)
        return varlen_sdpa(module, query, key, value, None, **kwargs)
    assert _original_sdpa is not None
    return _original_sdpa(module, query, key, value, attention_mask, **kwargs)


def _install() -> None:
    """Once per process: ``_sdpa`` as transformers' ``sdpa``, and no dense mask built for
    a model that ``use_varlen_attention`` was given."""
    global _original_sdpa
    with _installed:
        if _original_sdpa is not None:
            return
        from transformers import AttentionInterface
        from transformers.generation.continuous_batching import input_outputs
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        _original_sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]
        needed = input_outputs.attn_mask_is_needed

        def mask_needed(config: Any) -> bool:
            return not getattr(config, _FLAG, False) and bool(needed(config))

        input_outputs.attn_mask_is_needed = mask_needed
        AttentionInterface.register("sdpa", _sdpa)


def use_varlen_attention(model: Any, on: bool = True) -> bool:
    """Whether ``model``'s continuous-batching steps attend per sequence (``varlen_sdpa``)
    from its next batch on: only with ``sdpa`` (with another attention, the library's
    own is kept, and False)."""
    if on and model.config._attn_implementation != "sdpa":
        on = False
    if on:
        _install()
    setattr(model.config, _FLAG, on)
    return on
