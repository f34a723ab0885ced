"""Adapters an LLM function loads on first use (``LLMFunction.load_adapter``, as the
worker's adapter cache calls it for a call naming an adapter the function does not
list) and drops again: the adapter joins the model between two steps while other
calls stream, answers as it does when listed, and leaves nothing behind when it goes
or when it cannot be loaded."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from control_plane.protocol import LLMOptions
from tests.worker.llm.test_function import example_context
from worker.llm.function import LLMFunction
from worker.llm.serve import LLMRequestError
from worker.sdk import Adapter, CallContext, Context

OPTIONS = LLMOptions(max_num_seqs=4, kv_cache_mb=2, max_tokens_limit=64)
REQUEST = {"prompt": "Hello, world!", "max_tokens": 24, "temperature": 0}
# As a call names an adapter pushed to the store: PEFT's layer names cannot hold ".".
PUSHED = "pirate:v1.2"


@pytest.fixture(scope="module")
def ctx(tmp_path_factory: pytest.TempPathFactory) -> Context:
    return example_context(tmp_path_factory.mktemp("loaded-adapters"))


@pytest.fixture(scope="module")
def listed(ctx: Context) -> Iterator[dict[str | None, str]]:
    """What a function that lists the pirate adapter says through it and through none."""
    fn = LLMFunction(OPTIONS)
    fn.setup(ctx)
    try:
        yield {name: text(fn, name) for name in (None, "pirate")}
    finally:
        fn.close()


def start(ctx: Context, options: LLMOptions = OPTIONS) -> LLMFunction:
    """A function over the same model that lists no adapter."""
    fn = LLMFunction(options)
    fn.setup(dataclasses.replace(ctx, adapters={}))
    return fn


def pushed(ctx: Context, name: str = PUSHED) -> Adapter:
    """The pirate adapter as the worker fetches it for a call naming ``name``."""
    pirate = ctx.adapters["pirate"]
    return Adapter(name, pirate.tensors, pirate.config)


def text(fn: LLMFunction, adapter: str | None, request: dict[str, Any] = REQUEST) -> str:
    return str(fn(request, CallContext("c", adapter=adapter))["text"])


def test_an_adapter_loaded_while_a_call_streams_answers_as_listed(
    ctx: Context, listed: dict[str | None, str]
) -> None:
    fn = start(ctx)
    try:
        assert text(fn, None) == listed[None]
        with pytest.raises(LLMRequestError, match=r"unknown adapter 'pirate:v1\.2'"):
            text(fn, PUSHED)
        long = {"prompt": "Once upon a time", "max_tokens": 48, "temperature": 0}
        base_long = text(fn, None, long)
        chunks = fn(long, CallContext("s", stream=True))
        first = next(chunks)["text"]  # the base call is in the engine's batch
        fn.load_adapter(pushed(ctx))  # between two of its steps
        assert first + "".join(c["text"] for c in chunks) == base_long
        assert text(fn, PUSHED) == listed["pirate"] != listed[None]
        assert text(fn, None) == listed[None]
    finally:
        fn.close()


def test_an_adapter_dropped_is_unknown_and_loaded_again_answers_the_same(
    ctx: Context, listed: dict[str | None, str]
) -> None:
    fn = start(ctx)
    try:
        fn.load_adapter(pushed(ctx))
        fn.load_adapter(pushed(ctx, "pirate"))  # two loads of one adapter, side by side
        assert text(fn, PUSHED) == text(fn, "pirate") == listed["pirate"]
        fn.unload_adapter(PUSHED)
        with pytest.raises(LLMRequestError, match=r"unknown adapter 'pirate:v1\.2'"):
            text(fn, PUSHED)
        assert text(fn, "pirate") == listed["pirate"]
        fn.unload_adapter("pirate")
        assert text(fn, None) == listed[None]
        assert fn.llm is not None and fn.llm.adapters == []
        fn.load_adapter(pushed(ctx))
        assert text(fn, PUSHED) == listed["pirate"]
    finally:
        fn.close()


def test_with_mixed_adapters_off_a_loaded_adapter_takes_its_turn(
    ctx: Context, listed: dict[str | None, str]
) -> None:
    fn = start(ctx, OPTIONS.model_copy(update={"mixed_adapters": False}))
    try:
        assert fn.llm is not None and fn.llm.gate is not None
        assert text(fn, None) == listed[None]
        fn.load_adapter(pushed(ctx))  # the model held the base: so it does after
        assert text(fn, None) == listed[None]
        assert text(fn, PUSHED) == listed["pirate"]
        fn.unload_adapter(PUSHED)  # the adapter the model ran last
        assert text(fn, None) == listed[None]
        fn.load_adapter(pushed(ctx))
        assert text(fn, PUSHED) == listed["pirate"]
    finally:
        fn.close()


def test_with_the_gate_an_adapter_dropped_during_a_switch_waits_for_it(
    ctx: Context, listed: dict[str | None, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fn = start(ctx, OPTIONS.model_copy(update={"mixed_adapters": False}))
    try:
        assert fn.llm is not None
        fn.load_adapter(pushed(ctx))
        fn.load_adapter(pushed(ctx, "pirate"))
        switching = threading.Event()
        wait_idle = fn.llm.engine.wait_idle

        def slow_wait_idle(timeout_s: float = 10.0) -> bool:
            switching.set()  # the gate is held for the switch from here on
            time.sleep(0.5)
            return wait_idle(timeout_s)

        monkeypatch.setattr(fn.llm.engine, "wait_idle", slow_wait_idle)
        answers: list[str] = []
        call = threading.Thread(target=lambda: answers.append(text(fn, "pirate")))
        call.start()
        assert switching.wait(10)
        dropped = threading.Thread(target=fn.unload_adapter, args=(PUSHED,))
        dropped.start()
        dropped.join(10)
        call.join(10)
        assert not dropped.is_alive() and not call.is_alive(), "the switch and the drop deadlocked"
        assert answers == [listed["pirate"]]
        assert text(fn, None) == listed[None]
    finally:
        fn.close()


def embedding_adapter(ctx: Context) -> Adapter:
    """A LoRA on the token embeddings (PEFT's own tensors): not mixed per token."""
    import torch
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from transformers import AutoConfig, AutoModelForCausalLM

    assert ctx.files is not None
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(ctx.files))
    config = LoraConfig(r=4, target_modules=["embed_tokens"])
    peft_model = get_peft_model(model, config)
    tensors = {
        k: v.detach().clone()
        for k, v in get_peft_model_state_dict(peft_model, save_embedding_layers=False).items()
    }
    fields = {"r": 4, "lora_alpha": 8, "target_modules": ["embed_tokens"], "peft_type": "LORA"}
    assert all(isinstance(t, torch.Tensor) for t in tensors.values())
    return Adapter("embedder:v1", tensors, fields)


def test_an_adapter_that_cannot_be_loaded_says_why_and_leaves_nothing(
    ctx: Context, listed: dict[str | None, str]
) -> None:
    fn = start(ctx)
    try:
        fn.load_adapter(pushed(ctx))
        with pytest.raises(LLMRequestError, match="cannot run in one batch beside other"):
            fn.load_adapter(embedding_adapter(ctx))
        wrong = Adapter("wrong:v1", {}, {"r": 4, "target_modules": ["no_such_layer"]})
        with pytest.raises(LLMRequestError, match="'wrong:v1' does not fit this model"):
            fn.load_adapter(wrong)
        assert fn.llm is not None and fn.llm.adapters == [PUSHED]
        assert text(fn, PUSHED) == listed["pirate"]
        assert text(fn, None) == listed[None]
        fn.load_adapter(pushed(ctx, "pirate"))  # the refused ones left no layer that refuses
        with pytest.raises(LLMRequestError, match="unknown adapter 'embedder:v1'"):
            text(fn, "embedder:v1")
    finally:
        fn.close()


def test_a_first_adapter_of_the_wrong_shape_leaves_the_base_model_as_it_was(
    ctx: Context, listed: dict[str | None, str]
) -> None:
    fn = start(ctx)
    try:
        pirate = ctx.adapters["pirate"]
        halved = {**pirate.config, "r": pirate.config["r"] // 2}  # its tensors are r 8
        with pytest.raises(LLMRequestError, match="'halved:v1' does not fit this model"):
            fn.load_adapter(Adapter("halved:v1", pirate.tensors, halved))
        # PEFT had put the adapter's layers into the model before the tensors failed.
        assert text(fn, None) == listed[None]
        fn.load_adapter(pushed(ctx))
        assert text(fn, PUSHED) == listed["pirate"] and text(fn, None) == listed[None]
    finally:
        fn.close()


def test_steps_on_cuda_graphs_refuse_a_load(ctx: Context) -> None:
    fn = start(ctx)
    try:
        assert fn.llm is not None
        fn.llm.engine.cuda_graphs = True  # as on a GPU: a graph keeps its captured layers
        with pytest.raises(LLMRequestError, match=r"list it under \[\[adapters\]\]"):
            fn.load_adapter(pushed(ctx))
        fn.llm.engine.cuda_graphs = False
        assert fn.llm.adapters == []
    finally:
        fn.close()
