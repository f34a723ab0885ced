"""The LLM engine and function on a GPU (skipped without one): in a batch on CUDA, greedy
tokens equal ``model.generate`` alone on the same device, and the function built from a
CUDA Context answers a call, an adapter's included."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from control_plane.protocol import LLMOptions
from examples.build_model import build_adapter, build_model
from snapshotter.loader import LoadedTensors
from worker.llm.engine import Engine, EngineSizes, Sampling
from worker.llm.function import LLMFunction
from worker.sdk import Adapter, CallContext, Context

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

VOCAB = 256
EOS = 2


def _tiny_llama_on_cuda() -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        eos_token_id=EOS,
        bos_token_id=1,
    )
    model = LlamaForCausalLM(config).eval().to("cuda")
    model.config._attn_implementation = "sdpa"
    return model


def _alone(model: Any, prompt: list[int], max_new_tokens: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt], device="cuda"),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device="cuda"),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            eos_token_id=EOS,
            pad_token_id=0,
        )
    return list(out[0, len(prompt) :].tolist())


def test_a_batch_on_cuda_gives_the_tokens_of_generate_alone() -> None:
    model = _tiny_llama_on_cuda()
    sizes = EngineSizes(max_num_seqs=8, max_batch_tokens=256, kv_cache_bytes=4 << 20)
    engine = Engine(model, sizes, eos_token_ids=[EOS])
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (3, 9, 17, 30)]

    def run(prompt: list[int]) -> list[int]:
        tokens: list[int] = []
        for step in engine.generate(prompt, Sampling(max_new_tokens=16)):
            tokens += step.token_ids
        return tokens

    try:
        with ThreadPoolExecutor(len(prompts)) as pool:
            results = list(pool.map(run, prompts))
    finally:
        engine.close()
    assert results == [_alone(model, p, 16) for p in prompts]


def _on_cuda(directory: Path) -> LoadedTensors:
    weights = LoadedTensors()
    for shard in sorted(directory.glob("*.safetensors")):
        weights.update({k: v.to("cuda") for k, v in load_file(shard).items()})
    weights.report = None  # type: ignore[assignment]  # read from files, not the store
    return weights


def test_the_llm_function_answers_on_cuda(tmp_path: Path) -> None:
    model_dir = build_model(tmp_path / "model")
    adapter_dir = build_adapter(model_dir, tmp_path / "pirate", seed=1)
    adapter_config = json.loads((adapter_dir / "adapter_config.json").read_text())
    ctx = Context(
        device="cuda",
        weights=_on_cuda(model_dir),
        config=json.loads((model_dir / "config.json").read_text()),
        files=model_dir,
        adapters={"pirate": Adapter("pirate", _on_cuda(adapter_dir), adapter_config)},
    )
    fn = LLMFunction(LLMOptions(max_num_seqs=4, kv_cache_mb=2, max_tokens_limit=64))
    fn.setup(ctx)
    try:
        for adapter in (None, "pirate"):
            call = CallContext("c1", adapter=adapter, stream=False)
            out = fn({"prompt": "Hello", "max_tokens": 8, "temperature": 0}, call)
            assert out["tokens"] == call.usage["completion_tokens"] >= 1
            assert out["finish_reason"] in ("stop", "length")
    finally:
        fn.close()
