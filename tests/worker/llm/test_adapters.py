"""LoRA adapters mixed in one engine batch (``worker.llm.adapters``): each request's
tokens go through its own adapter, or none, beside requests of other adapters in the
same steps, and each answers as its adapter alone through PEFT."""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch

from tests.worker.llm.test_engine import EOS, VOCAB, generate_alone, tiny_llama
from worker.llm.adapters import AdapterRouting, mixable, route_lora_layers
from worker.llm.engine import Engine, EngineError, EngineSizes, Sampling

# Each adapter targets other layers: a layer an adapter does not touch adds nothing.
TARGETS = {
    "pirate": ["q_proj", "v_proj"],
    "poet": ["v_proj", "o_proj", "down_proj"],
    "judge": ["q_proj", "k_proj", "gate_proj", "up_proj"],
}


def with_adapters(model: Any, targets: dict[str, list[str]], **extra: Any) -> Any:
    """``model`` in a PEFT model holding one LoRA adapter per entry of ``targets``,
    their B matrices drawn large enough to change what the model says."""
    from peft import LoraConfig, get_peft_model

    peft_model = None
    for seed, (name, modules) in enumerate(targets.items()):
        config = LoraConfig(r=4, lora_alpha=8, target_modules=modules, **extra)
        if peft_model is None:
            peft_model = get_peft_model(model, config, adapter_name=name)
        else:
            peft_model.add_adapter(name, config)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for key, param in peft_model.named_parameters():
                if f"lora_B.{name}." in key:
                    param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
    assert peft_model is not None
    return peft_model.eval()


@pytest.fixture(scope="module")
def mixed() -> Iterator[tuple[Engine, AdapterRouting, Any]]:
    """An engine whose LoRA layers are routed, and an untouched copy of its PEFT model."""
    peft_model = with_adapters(tiny_llama(), TARGETS)
    reference = copy.deepcopy(peft_model)
    routing = AdapterRouting(torch.device("cpu"))
    assert mixable(peft_model) is None
    assert (
        route_lora_layers(peft_model, routing) == 2 * 7
    )  # 7 linears of a layer targeted by one or more
    sizes = EngineSizes(max_num_seqs=8, max_batch_tokens=256, kv_cache_bytes=4 << 20)
    engine = Engine(
        peft_model.get_base_model(), sizes, eos_token_ids=[EOS], adapter_routing=routing
    )
    for name in TARGETS:
        engine.add_adapter(name)
    yield engine, routing, reference
    engine.close()


def alone(reference: Any, adapter: str | None, prompt: list[int], n: int) -> list[int]:
    """Greedy ``generate`` of ``prompt`` through ``adapter`` alone (None: the base)."""
    if adapter is None:
        with reference.disable_adapter():
            return generate_alone(reference, prompt, n)
    reference.set_adapter(adapter)
    return generate_alone(reference, prompt, n)


def test_requests_of_several_adapters_in_one_batch_answer_as_each_alone(
    mixed: tuple[Engine, AdapterRouting, Any],
) -> None:
    engine, routing, reference = mixed
    g = torch.Generator().manual_seed(3)
    names: list[str | None] = ["pirate", "poet", None, "judge", "pirate", "judge", "poet", None]
    prompts = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (5, 12, 7, 30)] * 2
    start = threading.Barrier(len(prompts))

    def one(i: int) -> list[int]:
        start.wait()  # all at once: they share the steps
        tokens: list[int] = []
        for step in engine.generate(prompts[i], Sampling(max_new_tokens=16), names[i]):
            tokens += step.token_ids
        return tokens

    with ThreadPoolExecutor(len(prompts)) as pool:
        got = list(pool.map(one, range(len(prompts))))
    for i, tokens in enumerate(got):
        assert tokens == alone(reference, names[i], prompts[i], 16), f"request {i} ({names[i]})"
    # Requests i and i + 4 share a prompt: through other adapters it says other things.
    assert got[0] == got[4] and all(got[i] != got[i + 4] for i in (1, 2, 3))
    assert routing.mixed_steps > 0
    assert routing.most_in_step == 4  # the three adapters and the base model in one step


def test_one_adapter_alone_in_the_batch_and_then_the_base(
    mixed: tuple[Engine, AdapterRouting, Any],
) -> None:
    engine, _, reference = mixed
    prompt = list(range(10, 30))
    for name in ("poet", None, "poet"):
        tokens = [
            t
            for s in engine.generate(prompt, Sampling(max_new_tokens=12), name)
            for t in s.token_ids
        ]
        assert tokens == alone(reference, name, prompt, 12)


def test_an_engine_refuses_an_adapter_it_was_not_given() -> None:
    sizes = EngineSizes(max_num_seqs=2, max_batch_tokens=64, kv_cache_bytes=1 << 20)
    engine = Engine(tiny_llama(), sizes, eos_token_ids=[EOS])
    try:
        with pytest.raises(EngineError, match="adapter 'pirate' is not loaded"):
            next(engine.generate([5, 6], Sampling(max_new_tokens=2), "pirate"))
        engine.add_adapter("pirate")
        with pytest.raises(EngineError, match="was not made for adapter 'pirate'"):
            engine.push([5, 6], Sampling(max_new_tokens=2), lambda _: None, "r1", "pirate")
    finally:
        engine.close()


def test_a_step_routes_each_adapter_to_its_tokens() -> None:
    routing = AdapterRouting(torch.device("cpu"))
    routing.set_step([("pirate", 3), (None, 2), ("poet", 1), ("pirate", 2)])
    assert routing.whole is None
    assert {name: index.tolist() for name, index in routing.groups} == {
        "pirate": [0, 1, 2, 6, 7],
        "poet": [5],
    }
    routing.set_step([("pirate", 4), ("pirate", 1)])
    assert (routing.whole, routing.groups) == ("pirate", [])
    routing.set_step([(None, 4), ("poet", 0)])  # a request with no tokens in the step
    assert (routing.whole, routing.groups) == (None, [])
    assert routing.mixed_steps == 1 and routing.most_in_step == 3


def test_a_routed_layer_adds_each_tokens_own_adapter() -> None:
    peft_model = with_adapters(tiny_llama(), {"pirate": ["q_proj"], "poet": ["q_proj"]})
    layer = peft_model.base_model.model.model.layers[0].self_attn.q_proj
    x = torch.randn(1, 5, 64)
    peft_model.set_adapter("pirate")
    via_pirate = layer(x)
    peft_model.set_adapter("poet")
    via_poet = layer(x)
    base = layer.base_layer(x)
    routing = AdapterRouting(torch.device("cpu"))
    route_lora_layers(peft_model, routing)
    routing.set_step([("poet", 2), (None, 1), ("pirate", 2)])
    out = layer(x)
    torch.testing.assert_close(out[0, :2], via_poet[0, :2])
    torch.testing.assert_close(out[0, 2], base[0, 2])
    torch.testing.assert_close(out[0, 3:], via_pirate[0, 3:])


@pytest.mark.parametrize(
    ("extra", "targets", "says"),
    [
        ({"use_dora": True}, {"pirate": ["q_proj"]}, "variant"),
        ({"modules_to_save": ["lm_head"]}, {"pirate": ["q_proj"]}, "modules_to_save"),
        ({}, {"pirate": ["embed_tokens"]}, "Embedding"),
    ],
)
def test_adapters_that_cannot_be_mixed_are_named(
    extra: dict[str, Any], targets: dict[str, list[str]], says: str
) -> None:
    refused = mixable(with_adapters(tiny_llama(), targets, **extra))
    assert refused is not None and says in refused


def _hashed_blocks(engine: Engine) -> int:
    """KV blocks the engine's cache keeps hashed for prefix reuse."""
    cache = engine._manager.batch_processor.cache
    return sum(len(a.ledger.hash_to_block) for a in cache.cache_allocators.values())


def test_prefix_blocks_are_reused_by_requests_of_the_same_adapter_only(
    mixed: tuple[Engine, AdapterRouting, Any],
) -> None:
    engine, _, reference = mixed
    prompt = torch.randint(3, VOCAB, (150,), generator=torch.Generator().manual_seed(11)).tolist()
    blocks = (len(prompt) - 1) // engine.sizes.page_size_tokens  # a match leaves one to prefill
    assert blocks == 2
    seen = []
    for name in ("pirate", "poet", None, "pirate", "poet"):
        before = _hashed_blocks(engine)
        tokens = [
            t
            for s in engine.generate(prompt, Sampling(max_new_tokens=6), name)
            for t in s.token_ids
        ]
        assert tokens == alone(reference, name, prompt, 6), name
        seen.append(_hashed_blocks(engine) - before)
    # The same tokens through another adapter are other blocks; again, the same ones.
    assert seen == [blocks, blocks, blocks, 0, 0]
