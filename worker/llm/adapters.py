"""LoRA adapters mixed in one batch: each token of an engine step goes through its own
request's adapter, or through none.

transformers' continuous batching packs a step's sequences into one row of tokens, and
PEFT's LoRA layers add the active adapter to every token of it (PEFT's own mixed
batches, ``adapter_names``, pick an adapter per row, and a step is one row). Here each
LoRA layer's forward is the base layer's, plus, for each adapter with tokens in the
step, ``B(A(x)) * scaling`` at those tokens only: PEFT's ``_mixed_batch_forward`` per
token. The engine says whose tokens are where before each step's forward
(``AdapterRouting.set_step``, from the step's requests in order and their query
lengths); a step whose tokens are all one adapter's, or all the base model's, takes no
indexing at all.

Plain LoRA on linear layers only (``mixable``): an adapter with DoRA or another PEFT
variant, LoRA on an embedding or a convolution, or ``modules_to_save`` (whole modules
of its own) runs one adapter at a time instead (``worker.llm.serve.AdapterGate``).

Only the engine's generation thread runs forwards, so the step's routing is plain
attributes, set before the forward and read by every layer of it.

A request's id carries its adapter load's salt, and the KV blocks kept for prefix
reuse are keyed by it (``worker.llm.prefix``): a prompt's blocks computed through one
adapter are reused by that adapter's requests only, and the base model's by the base
model's.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import torch


class AdapterRouting:
    """Which tokens of the running step go through which adapter. ``whole``: every
    token's adapter, when the step holds one only (None with no ``groups``: the base
    model's step); ``groups``: else, each adapter with tokens in the step and their
    places in it (the base model's tokens in none)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.whole: str | None = None
        self.groups: list[tuple[str, torch.Tensor]] = []
        self.mixed_steps = 0  # steps that held tokens of several adapters (base included)
        self.most_in_step = 0  # the most adapters (base included) one step held

    def set_step(self, requests: Sequence[tuple[str | None, int]]) -> None:
        """The step's requests in the order their tokens are packed: each one's adapter
        (None: the base model) and how many query tokens it has in the step."""
        names = {name for name, tokens in requests if tokens > 0}
        self.most_in_step = max(self.most_in_step, len(names))
        if len(names) <= 1:
            self.whole, self.groups = (names.pop() if names else None), []
            return
        self.mixed_steps += 1
        places: dict[str, list[int]] = {}
        at = 0
        for name, tokens in requests:
            if name is not None:
                places.setdefault(name, []).extend(range(at, at + tokens))
            at += tokens
        self.whole = None
        self.groups = [
            (name, torch.tensor(index, dtype=torch.long, device=self.device))
            for name, index in places.items()
        ]


def mixable(model: Any) -> str | None:
    """None when every adapter of ``model`` (a PEFT model) can run beside the others in
    one step; else why not, for the log."""
    from peft.tuners.lora import Linear, LoraLayer
    from peft.utils import ModulesToSaveWrapper

    for name, module in model.named_modules():
        if isinstance(module, ModulesToSaveWrapper) and len(module.modules_to_save):
            return f"an adapter replaces a whole module ({name}: modules_to_save)"
        if not isinstance(module, LoraLayer) or not _holds_adapters(module):
            continue  # a layer an unloaded adapter left behind adds nothing
        if type(module) is not Linear:
            return f"{name} is LoRA on a {type(module).__name__}, not a linear layer"
        if module.lora_variant or any(module.use_dora.values()):
            return f"{name} has a LoRA variant (DoRA or another) that is not mixed per token"
        if module.merged:
            return f"{name} has an adapter merged into its weights"
    return None


def _holds_adapters(layer: Any) -> bool:
    return any(len(getattr(layer, names, ())) for names in layer.adapter_layer_names)


def route_lora_layers(model: Any, routing: AdapterRouting) -> int:
    """Make each LoRA linear layer of ``model`` follow ``routing``; returns how many
    layers. ``mixable(model)`` must be None."""
    from peft.tuners.lora import Linear

    layers = 0
    for module in model.modules():
        if type(module) is Linear:
            module.forward = partial(_routed_forward, module, routing)  # type: ignore[method-assign]
            layers += 1
    return layers


def _routed_forward(
    layer: Any, routing: AdapterRouting, x: torch.Tensor, *args: Any, **kwargs: Any
) -> torch.Tensor:
    result: torch.Tensor = layer.base_layer(x, *args, **kwargs)
    if routing.whole is not None:
        if routing.whole in layer.lora_A:
            result = result + _delta(layer, routing.whole, x).to(result.dtype)
        return result
    if not routing.groups:
        return result
    flat_x = x.reshape(-1, x.shape[-1])
    out = result.reshape(-1, result.shape[-1])
    for name, index in routing.groups:
        if name in layer.lora_A:
            delta = _delta(layer, name, flat_x.index_select(0, index))
            out = out.index_add(0, index, delta.to(out.dtype))
    return out.view(result.shape)


def _delta(layer: Any, name: str, x: torch.Tensor) -> torch.Tensor:
    """What adapter ``name`` adds to ``layer``'s output for inputs ``x`` (PEFT's own
    vanilla LoRA term)."""
    lora_a = layer.lora_A[name]
    x = x.to(lora_a.weight.dtype)
    return layer.lora_B[name](lora_a(layer.lora_dropout[name](x))) * layer.scaling[name]
