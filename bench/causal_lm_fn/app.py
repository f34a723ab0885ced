"""The function ``thaw bench coldstart --model DIR`` deploys: any causal LM, one forward pass.

The model is built from the pushed model's ``config.json`` with
``AutoModelForCausalLM.from_config`` on the meta device and filled with the weights
thaw streamed (their dtype is the checkpoint's); the adapters named in the spec are
loaded with PEFT. A call runs one forward pass on a few fixed token ids, as the naive
row does (``bench._coldstart_trials``), so no tokenizer is needed.

Input: anything (ignored). Output: ``{"tokens": N, "adapter": NAME | null}``.
"""

from __future__ import annotations

from typing import Any

import torch

TOKEN_IDS = (1, 2, 3, 4)


def forward_ids(vocab_size: int) -> torch.Tensor:
    return torch.tensor([[i % vocab_size for i in TOKEN_IDS]])


class CausalLM:
    def setup(self, ctx: Any) -> None:
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.for_model(**ctx.config)
        with ctx.empty_weights():
            model = AutoModelForCausalLM.from_config(config)
        ctx.fill_module(model)
        self.model: Any = model.eval()
        self.ids = forward_ids(config.vocab_size).to(ctx.device)
        for adapter in ctx.adapters.values():
            self.model = adapter.add_to(self.model)

    def __call__(self, input: Any, call: Any) -> Any:
        with torch.inference_mode():
            if call.adapter is not None:
                self.model.set_adapter(call.adapter)
            out = self.model(input_ids=self.ids)
            float(out.logits[0, -1, 0])  # waits for the device: the call ends when it has
        return {"tokens": int(self.ids.shape[1]), "adapter": call.adapter}
