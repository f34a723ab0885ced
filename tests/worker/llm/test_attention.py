"""Step masks (``worker.llm.attention``): on a packed step the attention gives what
transformers' dense mask gives (the library's own ``build_attention_mask``, the oracle),
and an engine that uses it builds no dense mask and answers as ``generate`` does, on a
model with sliding-window layers too."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch
from transformers.generation.continuous_batching.utils import build_attention_mask

from tests.worker.llm.test_engine import EOS, VOCAB, generate_alone, run_to_end, tiny_llama
from worker.llm import attention
from worker.llm.attention import packed_sdpa
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
    out, weights = packed_sdpa(
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
    assert out[:, real:].isfinite().all()  # padded queries: dropped, but not NaN


def test_a_sequence_never_sees_another_sequences_keys() -> None:
    query, key, value, cu_q, cu_k = _packed(seed=7)
    kwargs: dict[str, Any] = {
        "cu_seq_lens_q": torch.tensor(cu_q, dtype=torch.int32),
        "cu_seq_lens_k": torch.tensor(cu_k, dtype=torch.int32),
        "max_length_q": 5,
        "max_length_k": 12,
    }
    before, _ = packed_sdpa(None, query, key, value, None, **kwargs)
    other = value.clone()
    other[:, :, cu_k[1] : cu_k[2]] += 100.0  # the second sequence's values only
    after, _ = packed_sdpa(None, query, key, other, None, **kwargs)
    second = slice(cu_q[1], cu_q[2])
    assert not torch.allclose(before[:, second], after[:, second])
    rest = torch.ones(query.shape[2], dtype=torch.bool)
    rest[second] = False
    torch.testing.assert_close(before[:, rest], after[:, rest])


def test_a_steps_mask_is_kept_for_its_layers_and_made_again_for_the_next_step() -> None:
    query, key, value, cu_q, cu_k = _packed(seed=11)
    lengths_q = torch.tensor(cu_q, dtype=torch.int32)
    lengths_k = torch.tensor(cu_k, dtype=torch.int32)

    def attend() -> torch.Tensor:
        kwargs = {"cu_seq_lens_q": lengths_q, "cu_seq_lens_k": lengths_k}
        out, _ = packed_sdpa(
            None, query, key, value, None, max_length_q=1, max_length_k=1, **kwargs
        )
        return out

    first = attend()
    kept = attention._step_masks.by_window[None][1]
    torch.testing.assert_close(attend(), first)
    assert attention._step_masks.by_window[None][1] is kept  # the same step's next layer
    # The next step, in the same tensors written in place (as the library's static
    # inputs are): other lengths, the same token counts.
    cu_q2 = [0, 1, 4, 5, 9, 11, 14]
    cu_k2 = [0, 3, 13, 15, 25, 30, cu_k[-1]]
    lengths_q[:] = torch.tensor(cu_q2, dtype=torch.int32)
    lengths_k[:] = torch.tensor(cu_k2, dtype=torch.int32)
    second = attend()
    assert attention._step_masks.by_window[None][1] is not kept
    real = cu_q2[-1]
    expected = _with_dense_mask(query, key, value, cu_q2, cu_k2, window=1)
    torch.testing.assert_close(second[:, :real], expected[:, :real])


def _dense_mask_of(engine: Engine) -> Any:
    processor = engine._manager.batch_processor
    assert processor is not None  # made at the batch's first step
    return processor.model_runner.inputs_and_outputs.attention_mask


def tiny_qwen2_with_sliding_layers() -> Any:
    """A 4-layer Qwen2, its last two layers in a sliding window of 8 tokens."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        use_sliding_window=True,
        sliding_window=8,
        layer_types=["full_attention"] * 2 + ["sliding_attention"] * 2,
        max_position_embeddings=256,
        eos_token_id=EOS,
    )
    m = Qwen2ForCausalLM(config).eval()
    m.config._attn_implementation = "sdpa"
    return m


@pytest.mark.parametrize("step_masks", [True, False], ids=["step-mask", "dense-mask"])
@pytest.mark.parametrize(
    "make", [tiny_llama, tiny_qwen2_with_sliding_layers], ids=["llama", "qwen2-sliding"]
)
def test_an_engine_answers_as_generate_with_either_attention(step_masks: bool, make: Any) -> None:
    model = make()
    # A batch of 32 tokens: the longer prompts are prefilled in chunks after a past.
    sizes = EngineSizes(max_num_seqs=8, max_batch_tokens=32, kv_cache_bytes=4 << 20)
    engine = Engine(model, sizes, eos_token_ids=[EOS], step_masks=step_masks)
    try:
        g = torch.Generator().manual_seed(3)
        prompts = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (2, 11, 40, 70)]
        greedy = Sampling(max_new_tokens=12)
        with ThreadPoolExecutor(len(prompts)) as pool:
            got = list(pool.map(lambda p: run_to_end(engine, p, greedy)[0], prompts))
        assert got == [generate_alone(model, p, 12) for p in prompts]
        assert engine.step_masks is step_masks
        mask = _dense_mask_of(engine)
        if step_masks:
            assert mask is None
        else:  # transformers' own: a mask as wide as the cache, per layer type
            assert mask is not None
            for dense in mask.values():  # one per layer type
                assert dense.shape[-2] == sizes.max_batch_tokens
                assert dense.shape[-1] > engine.num_blocks * sizes.page_size_tokens
    finally:
        engine.close()


def test_a_layer_that_caps_its_scores_is_refused_not_answered_without_the_cap() -> None:
    query, key, value, cu_q, cu_k = _packed(seed=1)
    kwargs: dict[str, Any] = {
        "cu_seq_lens_q": torch.tensor(cu_q, dtype=torch.int32),
        "cu_seq_lens_k": torch.tensor(cu_k, dtype=torch.int32),
    }
    with pytest.raises(ValueError, match="do not apply softcap"):
        packed_sdpa(None, query, key, value, None, softcap=50.0, **kwargs)


def test_step_masks_go_only_on_a_model_whose_scores_a_mask_describes() -> None:
    from transformers import Gemma2Config, Gemma2ForCausalLM

    llama = tiny_llama()
    assert attention.use_step_masks(llama)
    assert attention.uses_step_masks(llama.config)
    assert "step_mask" not in llama.config.to_json_string()  # nothing saved with it
    assert not attention.use_step_masks(llama, on=False)
    assert not attention.uses_step_masks(llama.config)
    config = Gemma2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        attn_logit_softcapping=50.0,
    )
    gemma = Gemma2ForCausalLM(config)
    gemma.config._attn_implementation = "sdpa"
    assert not attention.use_step_masks(gemma)  # the library's own (sdpa refuses the cap)
    llama.config._attn_implementation = "eager"
    assert not attention.use_step_masks(llama)
