"""Attention per sequence (``worker.llm.attention``): on a packed step it gives what
transformers' dense mask gives (the library's own ``build_attention_mask``, the oracle),
and an engine that uses it builds no dense mask and answers as ``generate`` does."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch
from transformers.generation.continuous_batching.utils import build_attention_mask

from tests.worker.llm.test_engine import EOS, VOCAB, generate_alone, run_to_end, tiny_llama
from worker.llm.attention import varlen_sdpa
from worker.llm.engine import Engine, EngineSizes, Sampling

HEADS, KV_HEADS, DIM = 4, 2, 8
# (query tokens, key tokens) per sequence: a prefill, a chunk after a past, decodes, a
# one-token prompt, and a fake sequence of none (transformers pads the batch so)
SEQUENCES = [(5, 5), (3, 10), (1, 7), (1, 1), (4, 12), (0, 0)]
PADDED_Q = 2  # query tokens after the last sequence, as a padded step has


def _packed(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int], list[int]]:
    g = torch.Generator().manual_seed(seed)
    cu_q, cu_k = [0], [0]
    for q, k in SEQUENCES:
        cu_q.append(cu_q[-1] + q)
        cu_k.append(cu_k[-1] + k)
    query = torch.randn(1, HEADS, cu_q[-1] + PADDED_Q, DIM, generator=g)
    key = torch.randn(1, KV_HEADS, cu_k[-1], DIM, generator=g)
    value = torch.randn(1, KV_HEADS, cu_k[-1], DIM, generator=g)
    return query, key, value, cu_q, cu_k


def _with_dense_mask(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_q: list[int],
    cu_k: list[int],
    window: int,
) -> torch.Tensor:
    """What transformers' continuous batching computes with ``sdpa``: every query against
    every key of the step, under the dense mask the library builds."""
    mask = torch.full((1, 1, query.shape[2], key.shape[2]), torch.finfo(torch.float32).min)
    build_attention_mask(mask, cu_q, cu_k, sliding_window=window)
    groups = HEADS // KV_HEADS
    out = torch.nn.functional.scaled_dot_product_attention(
        query,
        key.repeat_interleave(groups, dim=1),
        value.repeat_interleave(groups, dim=1),
        attn_mask=mask,
    )
    return out.transpose(1, 2)  # [1, q_tokens, heads, dim]


@pytest.mark.parametrize("window", [1, 4], ids=["causal", "sliding-window-4"])
def test_per_sequence_attention_equals_the_dense_masks(window: int) -> None:
    query, key, value, cu_q, cu_k = _packed(seed=window)
    out, weights = varlen_sdpa(
        None,
        query,
        key,
        value,
        None,
        cu_seq_lens_q=torch.tensor(cu_q, dtype=torch.int32),
        cu_seq_lens_k=torch.tensor(cu_k, dtype=torch.int32),
        max_length_q=max(q for q, _ in SEQUENCES),
        max_length_k=max(k for _, k in SEQUENCES),
        sliding_window=window if window > 1 else None,
    )
    assert weights is None
    assert out.shape == (1, query.shape[2], HEADS, DIM)
    real = cu_q[-1]
    expected = _with_dense_mask(query, key, value, cu_q, cu_k, window)
    torch.testing.assert_close(out[:, :real], expected[:, :real])
    assert not out[:, real:].any()  # padded queries' rows are zeros, not NaN


def test_a_sequence_never_sees_another_sequences_keys() -> None:
    query, key, value, cu_q, cu_k = _packed(seed=7)
    kwargs: dict[str, Any] = {
        "cu_seq_lens_q": torch.tensor(cu_q, dtype=torch.int32),
        "cu_seq_lens_k": torch.tensor(cu_k, dtype=torch.int32),
        "max_length_q": 5,
        "max_length_k": 12,
    }
    before, _ = varlen_sdpa(None, query, key, value, None, **kwargs)
    other = value.clone()
    other[:, :, cu_k[1] : cu_k[2]] += 100.0  # the second sequence's values only
    after, _ = varlen_sdpa(None, query, key, other, None, **kwargs)
    second = slice(cu_q[1], cu_q[2])
    assert not torch.allclose(before[:, second], after[:, second])
    rest = torch.ones(query.shape[2], dtype=torch.bool)
    rest[second] = False
    torch.testing.assert_close(before[:, rest], after[:, rest])


def _dense_mask_of(engine: Engine) -> Any:
    processor = engine._manager.batch_processor
    assert processor is not None  # made at the batch's first step
    return processor.model_runner.inputs_and_outputs.attention_mask


@pytest.mark.parametrize("varlen", [True, False], ids=["per-sequence", "dense-mask"])
def test_an_engine_answers_as_generate_with_either_attention(varlen: bool) -> None:
    model = tiny_llama()
    # A batch of 32 tokens: the longer prompts are prefilled in chunks after a past.
    sizes = EngineSizes(max_num_seqs=8, max_batch_tokens=32, kv_cache_bytes=4 << 20)
    engine = Engine(model, sizes, eos_token_ids=[EOS], varlen_attention=varlen)
    try:
        g = torch.Generator().manual_seed(3)
        prompts = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (2, 11, 40, 70)]
        greedy = Sampling(max_new_tokens=12)
        with ThreadPoolExecutor(len(prompts)) as pool:
            got = list(pool.map(lambda p: run_to_end(engine, p, greedy)[0], prompts))
        assert got == [generate_alone(model, p, 12) for p in prompts]
        assert engine.varlen_attention is varlen
        mask = _dense_mask_of(engine)
        if varlen:
            assert mask is None
        else:  # transformers' own: a mask as wide as the cache, per layer type
            assert mask is not None
            (dense,) = mask.values()
            assert dense.shape[-2] == sizes.max_batch_tokens
            assert dense.shape[-1] > engine.num_blocks * sizes.page_size_tokens
    finally:
        engine.close()
