"""The LLM engine and function on a GPU (skipped without one): in a batch on CUDA, its
steps replaying CUDA graphs, greedy tokens equal ``model.generate`` alone on the same
device (eager steps under masks of their own size too, ``worker.llm.attention``); a step
shape's graph is captured when it comes again; a seed gives the same tokens alone and in
a busy batch; penalties and logprobs hold on graphed steps; a model whose forward
cannot be captured runs eagerly; and the function built from a CUDA Context answers a
call, an adapter's included (eagerly: a graph keeps the adapter it was captured with)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch

from control_plane.protocol import LLMOptions
from examples.build_model import build_adapter, build_model
from tests.worker.llm import test_engine as on_cpu
from tests.worker.llm.test_engine import (
    EOS,
    VOCAB,
    generate_alone,
    run_to_end,
    tiny_llama,
)
from tests.worker.llm.test_function import tensors_of
from worker.llm.attention import packed_sdpa
from worker.llm.engine import Engine, EngineSizes, Sampling
from worker.llm.function import LLMFunction
from worker.sdk import Adapter, CallContext, Context

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_a_batch_on_cuda_gives_the_tokens_of_generate_alone() -> None:
    model = tiny_llama().to("cuda")
    sizes = EngineSizes(max_num_seqs=8, max_batch_tokens=256, kv_cache_bytes=4 << 20)
    engine = Engine(model, sizes, eos_token_ids=[EOS])
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (3, 9, 17, 30)]

    def run(prompt: list[int]) -> list[int]:
        return run_to_end(engine, prompt, Sampling(max_new_tokens=16))[0]

    try:
        assert engine.cuda_graphs
        with ThreadPoolExecutor(len(prompts)) as pool:
            results = list(pool.map(run, prompts))
    finally:
        engine.close()
    assert results == [generate_alone(model, p, 16) for p in prompts]


@pytest.mark.parametrize("window", [1, 4], ids=["causal", "sliding-window-4"])
def test_step_masks_on_cuda_equal_the_dense_masks(window: int) -> None:
    from tests.worker.llm import test_attention as step_masks

    query, key, value, cu_q, cu_k = step_masks._packed(seed=window)
    out, _ = packed_sdpa(
        None,
        query.cuda(),
        key.cuda(),
        value.cuda(),
        None,
        cu_seq_lens_q=torch.tensor(cu_q, dtype=torch.int32, device="cuda"),
        cu_seq_lens_k=torch.tensor(cu_k, dtype=torch.int32, device="cuda"),
        max_length_q=5,
        max_length_k=12,
        sliding_window=window if window > 1 else None,
    )
    real = cu_q[-1]
    expected = step_masks._with_dense_mask(query, key, value, cu_q, cu_k, window)
    torch.testing.assert_close(out[:, :real].cpu(), expected[:, :real], rtol=1e-4, atol=1e-4)


def test_eager_steps_on_cuda_with_step_masks_give_the_tokens_of_generate_alone() -> None:
    model = tiny_llama().to("cuda")
    # Chunked prefills after a past, and decodes: every kind of step, eagerly.
    sizes = EngineSizes(max_num_seqs=8, max_batch_tokens=32, kv_cache_bytes=4 << 20)
    engine = Engine(model, replace(sizes, cuda_graphs=False), eos_token_ids=[EOS])
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (2, 11, 40, 70)]
    try:
        assert engine.step_masks and not engine.cuda_graphs
        run = partial(run_to_end, engine, sampling=Sampling(16))
        with ThreadPoolExecutor(len(prompts)) as pool:
            results = [tokens for tokens, _ in pool.map(run, prompts)]
    finally:
        engine.close()
    assert results == [generate_alone(model, p, 16) for p in prompts]


@pytest.mark.parametrize("graphs", [True, False], ids=["graphed", "eager"])
@pytest.mark.parametrize("make", ["tiny_gemma2", "tiny_gpt_oss"])
def test_capped_scores_and_sinks_on_cuda_give_the_tokens_of_generate_alone(
    make: str, graphs: bool
) -> None:
    """Gemma 2's capped scores and gpt-oss's sinks (eager models: thaw computes their
    attention), in graphed steps under the library's mask and in eager ones under step
    masks."""
    from tests.worker.llm import test_attention

    model = getattr(test_attention, make)().to("cuda")
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (2, 11, 40, 70)]
    expected = [generate_alone(model, p, 12) for p in prompts]
    sizes = EngineSizes(max_num_seqs=8, max_batch_tokens=64, kv_cache_bytes=4 << 20)
    engine = Engine(model, replace(sizes, cuda_graphs=graphs), eos_token_ids=[EOS])
    try:
        assert engine.cuda_graphs is graphs
        run = partial(run_to_end, engine, sampling=Sampling(12))
        with ThreadPoolExecutor(len(prompts)) as pool:
            results = [tokens for tokens, _ in pool.map(run, prompts)]
    finally:
        engine.close()
    assert results == expected


def test_graphed_and_eager_steps_on_cuda_give_the_same_greedy_tokens() -> None:
    model = tiny_llama().to("cuda")
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (4, 11, 40, 70)]
    results = []
    for graphs in (True, False):
        sizes = EngineSizes(max_num_seqs=8, max_batch_tokens=256, kv_cache_bytes=4 << 20)
        engine = Engine(  # every shape captured at once: the graphed run replays them all
            model, replace(sizes, cuda_graphs=graphs), eos_token_ids=[EOS], capture_at=1
        )
        try:
            assert engine.cuda_graphs is graphs
            run = partial(run_to_end, engine, sampling=Sampling(24))
            with ThreadPoolExecutor(len(prompts)) as pool:
                results.append([tokens for tokens, _ in pool.map(run, prompts)])
        finally:
            engine.close()
    assert results[0] == results[1]


def test_on_cuda_a_step_shape_is_captured_when_it_comes_again_and_the_tokens_hold() -> None:
    model = tiny_llama().to("cuda")
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (5, 13, 44)]
    sizes = EngineSizes(max_num_seqs=8, max_batch_tokens=256, kv_cache_bytes=4 << 20)
    engine = Engine(model, sizes, eos_token_ids=[EOS])
    try:
        gate = engine.capture_gate
        assert engine.cuda_graphs and gate is not None
        graphs = engine._manager.batch_processor.inputs_and_outputs.graphs._storage
        made = len(graphs)  # the warmup's and the probe's
        first = [run_to_end(engine, p, Sampling(12))[0] for p in prompts]
        assert gate.eager_steps > 0 and gate.captures == 0 and len(graphs) == made
        second = [run_to_end(engine, p, Sampling(12))[0] for p in prompts]
        assert gate.captures > 0 and len(graphs) == made + gate.captures
    finally:
        engine.close()
    assert first == second == [generate_alone(model, p, 12) for p in prompts]


def test_a_seed_on_graphed_cuda_steps_gives_the_same_tokens_alone_and_in_a_busy_batch() -> None:
    model = tiny_llama().to("cuda")
    sizes = EngineSizes(max_num_seqs=8, max_batch_tokens=256, kv_cache_bytes=4 << 20)
    engine = Engine(model, sizes, eos_token_ids=[EOS])
    try:
        assert engine.cuda_graphs
        on_cpu.test_a_seed_gives_the_same_tokens_alone_and_in_a_busy_batch(model, engine)
    finally:
        engine.close()


def test_penalties_and_logprobs_on_graphed_cuda_steps_answer_as_on_the_cpu() -> None:
    """Their dense forms: buffers filled when a step is prepared, read by its graph."""
    from tests.worker.llm import test_logprobs, test_penalties

    model = tiny_llama().to("cuda")
    sizes = EngineSizes(max_num_seqs=8, max_batch_tokens=256, kv_cache_bytes=4 << 20)
    engine = Engine(model, sizes, eos_token_ids=[EOS], capture_at=1)  # every step graphed
    try:
        assert engine.cuda_graphs
        test_penalties.test_penalised_requests_beside_plain_ones_answer_as_alone(model, engine)
        test_logprobs.test_logprobs_are_the_models_own_beside_requests_without_them(model, engine)
        assert engine.capture_gate is not None and engine.capture_gate.eager_steps == 0
    finally:
        engine.close()


def test_a_model_whose_forward_cannot_be_captured_runs_eagerly_on_cuda() -> None:
    model = tiny_llama().to("cuda")

    def host_sync(module: Any, args: Any, output: Any) -> None:
        hidden = output if isinstance(output, torch.Tensor) else output[0]
        hidden.sum().item()  # a copy to the host: not allowed while a graph is captured

    hook = model.model.layers[0].register_forward_hook(host_sync)
    sizes = EngineSizes(max_num_seqs=4, max_batch_tokens=128, kv_cache_bytes=1 << 20)
    engine = Engine(model, sizes, eos_token_ids=[EOS])
    try:
        assert not engine.cuda_graphs
        prompt = [5, 9, 33, 61, 100]
        assert run_to_end(engine, prompt, Sampling(12))[0] == generate_alone(model, prompt, 12)
    finally:
        engine.close()
        hook.remove()


def test_the_llm_function_answers_on_cuda(tmp_path: Path) -> None:
    model_dir = build_model(tmp_path / "model")
    adapter_dir = build_adapter(model_dir, tmp_path / "pirate", seed=1)
    adapter_config = json.loads((adapter_dir / "adapter_config.json").read_text())
    ctx = Context(
        device="cuda",
        weights=tensors_of(model_dir, "cuda"),
        config=json.loads((model_dir / "config.json").read_text()),
        files=model_dir,
        adapters={"pirate": Adapter("pirate", tensors_of(adapter_dir, "cuda"), adapter_config)},
    )
    fn = LLMFunction(LLMOptions(max_num_seqs=4, kv_cache_mb=2, max_tokens_limit=64))
    fn.setup(ctx)
    try:
        assert not fn.llm.engine.cuda_graphs  # with adapters
        for adapter in (None, "pirate"):
            call = CallContext("c1", adapter=adapter, stream=False)
            out = fn({"prompt": "Hello", "max_tokens": 8, "temperature": 0}, call)
            assert out["tokens"] == call.usage["completion_tokens"] >= 1
            assert out["finish_reason"] in ("stop", "length")
    finally:
        fn.close()
