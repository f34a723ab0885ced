"""Step masks (``worker.llm.attention``): on a packed step the attention gives what
transformers' dense mask gives (the library's own ``build_attention_mask``, the oracle),
and an engine that uses it builds no dense mask and answers as ``generate`` does, on a
model with sliding-window layers too."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from transformers.generation.continuous_batching.utils import build_attention_mask

from tests.worker.llm.test_engine import EOS, VOCAB, generate_alone, run_to_end, tiny_llama
from worker.llm import attention
from worker.llm.attention import packed_sdpa
from worker.llm.engine import Engine, EngineSizes, Sampling
from worker.llm.serve import _attention_for

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


# A batch of 32 tokens: the longer prompts are prefilled in chunks after a past.
SIZES = EngineSizes(max_num_seqs=8, max_batch_tokens=32, kv_cache_bytes=4 << 20)
# What the tiny models below share; each adds what sets its architecture apart.
TINY: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "eos_token_id": EOS,
    "bos_token_id": 1,
    "pad_token_id": 0,
}


@contextmanager
def answering_as_generate(model: Any, step_masks: bool = True) -> Iterator[Engine]:
    """An engine on ``model`` that has answered four concurrent greedy prompts as the
    model's own ``generate`` answers each alone (asserted), open for more checks."""
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (2, 11, 40, 70)]
    expected = [generate_alone(model, p, 12) for p in prompts]
    engine = Engine(model, SIZES, eos_token_ids=[EOS], step_masks=step_masks)
    try:
        greedy = Sampling(max_new_tokens=12)
        with ThreadPoolExecutor(len(prompts)) as pool:
            got = list(pool.map(lambda p: run_to_end(engine, p, greedy)[0], prompts))
        assert got == expected
        yield engine
    finally:
        engine.close()


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
    with answering_as_generate(make(), step_masks) as engine:
        assert engine.step_masks is step_masks
        mask = _dense_mask_of(engine)
        if step_masks:
            assert mask is None
        else:  # transformers' own: a mask as wide as the cache, per layer type
            assert mask is not None
            for dense in mask.values():  # one per layer type
                assert dense.shape[-2] == SIZES.max_batch_tokens
                assert dense.shape[-1] > engine.num_blocks * SIZES.page_size_tokens


def _model_eager_attention(name: str) -> Any:
    """The model's own eager attention (the oracle for scores beyond a mask)."""
    if name == "softcap":
        from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward
    else:
        from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward
    return eager_attention_forward


@pytest.mark.parametrize("window", [1, 4], ids=["causal", "sliding-window-4"])
@pytest.mark.parametrize("scores", ["softcap", "sinks"])
def test_capped_scores_and_sinks_on_a_packed_step_equal_the_models_own_attention(
    scores: str, window: int
) -> None:
    query, key, value, cu_q, cu_k = _packed(seed=5 + window)
    query = query * 4  # scores large enough that a cap of 2 changes them
    sinks = torch.randn(HEADS, generator=torch.Generator().manual_seed(2)) * 3
    module = SimpleNamespace(num_key_value_groups=HEADS // KV_HEADS, head_dim=DIM, training=False)
    module.sinks = sinks
    extra: dict[str, Any] = {"softcap": 2.0} if scores == "softcap" else {"s_aux": sinks}
    out, _ = packed_sdpa(
        module,
        query,
        key,
        value,
        None,
        scaling=0.3,
        cu_seq_lens_q=torch.tensor(cu_q, dtype=torch.int32),
        cu_seq_lens_k=torch.tensor(cu_k, dtype=torch.int32),
        sliding_window=window if window > 1 else None,
        **extra,
    )
    dense = torch.full((1, 1, query.shape[2], key.shape[2]), torch.finfo(torch.float32).min)
    build_attention_mask(dense, cu_q, cu_k, sliding_window=window)
    expected, _ = _model_eager_attention(scores)(
        module, query, key, value, dense, scaling=0.3, **extra
    )
    real = cu_q[-1]
    torch.testing.assert_close(out[:, :real], expected[:, :real])
    # and not what the scores alone give: the cap or the sinks were applied
    plain, _ = packed_sdpa(
        None,
        query,
        key,
        value,
        None,
        scaling=0.3,
        cu_seq_lens_q=torch.tensor(cu_q, dtype=torch.int32),
        cu_seq_lens_k=torch.tensor(cu_k, dtype=torch.int32),
        sliding_window=window if window > 1 else None,
    )
    assert not torch.allclose(plain[:, :real], expected[:, :real], atol=1e-3)


def test_a_position_bias_is_refused_not_answered_without_it() -> None:
    query, key, value, cu_q, cu_k = _packed(seed=1)
    kwargs: dict[str, Any] = {
        "cu_seq_lens_q": torch.tensor(cu_q, dtype=torch.int32),
        "cu_seq_lens_k": torch.tensor(cu_k, dtype=torch.int32),
    }
    bias = torch.zeros(1, HEADS, query.shape[2], key.shape[2])
    with pytest.raises(ValueError, match="do not apply position_bias"):
        packed_sdpa(None, query, key, value, None, position_bias=bias, **kwargs)


def tiny_gemma2() -> Any:
    """A 2-layer Gemma 2 whose attention caps its scores, the second layer in a sliding
    window of 8; loaded as thaw loads it (eager). Its queries are drawn large, so that
    the cap changes the answer."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    config = Gemma2Config(
        **TINY,
        head_dim=16,
        sliding_window=8,
        attn_logit_softcapping=1.0,
        final_logit_softcapping=3.0,
    )
    m = Gemma2ForCausalLM(config).eval()
    with torch.no_grad():
        for layer in m.model.layers:
            layer.self_attn.q_proj.weight.mul_(40)
    m.config._attn_implementation = _attention_for(config)
    return m


def tiny_gpt_oss() -> Any:
    """A 2-layer gpt-oss (attention sinks, experts, a sliding layer), loaded as thaw
    loads it (eager); its sinks drawn large, so that they matter."""
    from transformers import GptOssConfig, GptOssForCausalLM

    torch.manual_seed(0)
    config = GptOssConfig(
        **{**TINY, "intermediate_size": 64},
        head_dim=16,
        sliding_window=8,
        num_local_experts=4,
        num_experts_per_tok=2,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    m = GptOssForCausalLM(config).eval()
    with torch.no_grad():
        for layer in m.model.layers:
            layer.self_attn.sinks.normal_(0, 2, generator=torch.Generator().manual_seed(4))
    m.config._attn_implementation = _attention_for(config)
    return m


@pytest.mark.parametrize("step_masks", [True, False], ids=["step-mask", "dense-mask"])
@pytest.mark.parametrize(
    "make", [tiny_gemma2, tiny_gpt_oss], ids=["gemma2-softcap", "gpt-oss-sinks"]
)
def test_a_model_with_capped_scores_or_sinks_answers_as_generate(
    step_masks: bool, make: Any
) -> None:
    model = make()
    assert model.config._attn_implementation == "eager"  # transformers' sdpa refuses them
    with answering_as_generate(model, step_masks) as engine:  # the model's own eager
        assert engine.step_masks is step_masks


def test_each_architecture_gets_the_attention_it_can_batch_on() -> None:
    from transformers import BloomConfig, Gemma2Config, GptOssConfig, LlamaConfig, T5Config

    assert _attention_for(LlamaConfig()) == "sdpa"
    assert _attention_for(Gemma2Config()) == "eager"  # its scores are capped
    assert _attention_for(GptOssConfig()) == "eager"  # sinks
    with pytest.raises(ValueError, match=r"BloomForCausalLM \('bloom'\) cannot run on continuous"):
        _attention_for(BloomConfig())
    with pytest.raises(ValueError, match="'t5' is not a causal language model"):
        _attention_for(T5Config())


def test_step_masks_go_only_on_a_model_whose_attention_they_replace() -> None:
    llama = tiny_llama()
    assert attention.use_step_masks(llama)
    assert attention.uses_step_masks(llama.config)
    assert "step_mask" not in llama.config.to_json_string()  # nothing saved with it
    assert not attention.use_step_masks(llama, on=False)
    assert not attention.uses_step_masks(llama.config)
    gemma = tiny_gemma2()
    assert attention.use_step_masks(gemma)  # eager: the scores are capped here
    llama.config._attn_implementation = "flex_attention"
    assert not attention.use_step_masks(llama)


# Architectures a user may bring, each tiny, with what sets it apart: each engine's
# greedy answers under step masks against the model's own generate.
ARCHITECTURES: dict[str, tuple[str, dict[str, Any]]] = {
    "mistral-sliding": ("Mistral", {"sliding_window": 8}),
    "qwen3-qk-norm": ("Qwen3", {"head_dim": 16}),
    "phi3-fused-qkv": ("Phi3", {}),
    "gemma3-scaled-queries": (
        "Gemma3Text",
        {"head_dim": 16, "sliding_window": 8, "query_pre_attn_scalar": 7},
    ),
    "granite-multipliers": (
        "Granite",
        {"attention_multiplier": 0.3, "logits_scaling": 2.0, "embedding_multiplier": 3.0},
    ),
    "mixtral-experts": ("Mixtral", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    "qwen2-moe-shared-expert": (
        "Qwen2Moe",
        {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32},
    ),
    "phi-partial-rotary": ("Phi", {"partial_rotary_factor": 0.5}),
    "starcoder2-biases": ("Starcoder2", {"sliding_window": 8}),
}


@pytest.mark.parametrize("architecture", list(ARCHITECTURES))
def test_each_architecture_answers_as_generate_under_step_masks(architecture: str) -> None:
    import transformers

    name, extra = ARCHITECTURES[architecture]
    config_class = getattr(transformers, f"{name}Config")
    model_class = getattr(transformers, f"{name.removesuffix('Text')}ForCausalLM")
    torch.manual_seed(0)
    config = config_class(**TINY, **extra)
    model = model_class(config).eval()
    model.config._attn_implementation = _attention_for(config)
    with answering_as_generate(model) as engine:
        assert engine.step_masks
