"""Example thaw function: text generation with a Llama and LoRA adapters.

The model is built from the pushed model's ``config.json`` with its
parameters on the meta device (no memory, no initialisation) and filled
with the weights thaw already streamed onto the device; the tokenizer
comes from the model's small files. Nothing is downloaded.

Input::

    {"prompt": "Hello", "max_tokens": 32, "temperature": 0.0, "seed": 0}

Only these keys: any other (a misspelt ``max_new_tokens``, say) fails the call with
an error that names it.

A streaming caller gets ``{"text": "<piece>"}`` per generated token; any
other caller gets ``{"text": "<all of it>", "tokens": N}``. Pass
``"adapter": "pirate"`` in the request to generate through that LoRA
adapter (both are preloaded; switching is per call). Any other adapter
pushed with ``thaw models push`` can be named by ``NAME:TAG``: the worker
loads it on first use (``load_adapter``) and keeps the most recently used.

With ``[batching]`` in thaw.toml (``max_batch_size``, ``max_wait_ms``) the
replica calls ``batch`` with several requests at once instead (``batch_gen``):
the same answers, one forward pass per token for the whole batch.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch
from batch_gen import generate_batch

MAX_TOKENS_LIMIT = 256


class TextGen:
    def setup(self, ctx: Any) -> None:
        from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

        self.device = ctx.device
        self.tokenizer = PreTrainedTokenizerFast.from_pretrained(str(ctx.files))
        config = LlamaConfig.from_dict(ctx.config)
        with ctx.empty_weights():
            model = LlamaForCausalLM(config)
        ctx.fill_module(model)
        self.model: Any = model.eval()
        self.printable = _printable_mask(self.tokenizer, config.vocab_size)
        self.adapters: list[str] = []
        # One generation at a time: the active adapter is model state.
        self.lock = threading.Lock()
        for adapter in ctx.adapters.values():
            self.load_adapter(adapter)

    def load_adapter(self, adapter: Any) -> None:
        """Add a LoRA adapter to the model (PEFT); the worker calls this for new ones."""
        with self.lock:
            self.model = adapter.add_to(self.model)  # PEFT (worker/sdk.py)
            self.adapters = sorted({*self.adapters, adapter.name})

    def unload_adapter(self, name: str) -> None:
        with self.lock:
            self.model.delete_adapter(name)
            self.adapters = [a for a in self.adapters if a != name]

    def __call__(self, input: Any, call: Any) -> Any:
        params = self._check(input, call)
        pieces = self._generate(params, call.adapter, call.timings_ms)
        if call.stream:
            return ({"text": piece} for piece in pieces)
        text = list(pieces)
        return {"text": "".join(text), "tokens": len(text)}

    def batch(self, inputs: list[Any], calls: list[Any]) -> Any:
        """Used instead of ``__call__`` when thaw.toml has ``[batching]``: one forward
        pass per token for every prompt of the batch (left-padded, one KV cache)."""
        rows: list[dict[str, Any] | Exception] = []
        for input, call in zip(inputs, calls, strict=True):
            try:
                rows.append(self._check(input, call))
            except ValueError as exc:
                rows.append(exc)  # fails that call only
        return generate_batch(self, rows, calls[0].adapter)

    def _check(self, input: Any, call: Any) -> dict[str, Any]:
        params = _params(input)
        if call.adapter is not None and call.adapter not in self.adapters:
            raise ValueError(
                f"unknown adapter {call.adapter!r}; this function has {self.adapters or 'none'}"
            )
        return params

    def _generate(
        self, params: dict[str, Any], adapter: str | None, timings_ms: dict[str, float]
    ) -> Iterator[str]:
        ids = self.tokenizer(params["prompt"], return_tensors="pt").input_ids.to(self.device)
        generator = torch.Generator(device="cpu").manual_seed(params["seed"])
        with self.lock, torch.inference_mode(), self._adapter(adapter, timings_ms):
            past, step_ids, produced, text = None, ids, [], ""
            for _ in range(params["max_tokens"]):
                out = self.model(input_ids=step_ids, past_key_values=past, use_cache=True)
                past = out.past_key_values
                logits = out.logits[0, -1].float().cpu() + self.printable
                next_id = _pick(logits, params["temperature"], generator)
                if next_id == self.tokenizer.eos_token_id:
                    break
                produced.append(next_id)
                full = self.tokenizer.decode(produced)
                piece, text = full[len(text) :], full
                if piece:
                    yield piece
                step_ids = torch.tensor([[next_id]], device=self.device)

    def _adapter(
        self, name: str | None, timings_ms: dict[str, float] | None = None
    ) -> contextlib.AbstractContextManager[Any]:
        """The call's adapter active (none: the base model). With ``timings_ms``, the
        switch is reported as the call's ``adapter_switch`` phase."""
        if not self.adapters:
            return contextlib.nullcontext()
        if name is None:
            return self.model.disable_adapter()
        started = time.perf_counter()
        self.model.set_adapter(name)
        if timings_ms is not None:
            timings_ms["adapter_switch"] = (time.perf_counter() - started) * 1000
        return contextlib.nullcontext()


PARAMS = ("prompt", "max_tokens", "temperature", "seed")


def _params(input: Any) -> dict[str, Any]:
    if not isinstance(input, dict) or not isinstance(input.get("prompt"), str):
        raise ValueError('input must be an object with a "prompt" string')
    unknown = sorted(set(input) - set(PARAMS))
    if unknown:  # a misspelt limit would otherwise be ignored without a word
        raise ValueError(f"unknown input keys {unknown}; this function takes {list(PARAMS)}")
    max_tokens = int(input.get("max_tokens", 32))
    if not 1 <= max_tokens <= MAX_TOKENS_LIMIT:
        raise ValueError(f"max_tokens must be between 1 and {MAX_TOKENS_LIMIT}")
    return {
        "prompt": input["prompt"],
        "max_tokens": max_tokens,
        "temperature": float(input.get("temperature", 0.0)),
        "seed": int(input.get("seed", 0)),
    }


def _printable_mask(tokenizer: Any, vocab_size: int) -> torch.Tensor:
    """0 for tokens that decode to printable text (and end-of-sequence), -inf for the rest.

    The weights are random, so without this the model emits raw bytes and
    control characters as often as words.
    """
    mask = torch.full((vocab_size,), float("-inf"))
    special = set(tokenizer.all_special_ids)
    for token_id in range(min(vocab_size, len(tokenizer))):
        if token_id in special:
            continue
        text = tokenizer.decode([token_id])
        if text and text.isprintable() and "\ufffd" not in text:
            mask[token_id] = 0.0
    if tokenizer.eos_token_id is not None:
        mask[tokenizer.eos_token_id] = 0.0
    return mask


def _pick(logits: torch.Tensor, temperature: float, generator: torch.Generator) -> int:
    """Greedy at temperature 0, else a sample from the softmax."""
    if temperature <= 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))
