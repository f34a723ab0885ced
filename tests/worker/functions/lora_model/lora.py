"""A Llama with LoRA adapters switched per call (PEFT), to test the worker's adapters.

Input ``{"ids": [token ids]}``; output the last position's logits under the
call's adapter (the base model when the call names none), and which heavy
modules were already imported when this module was (a pooled process
preloads them).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Any

PRELOADED = sorted(m for m in ("torch", "transformers", "peft") if m in sys.modules)

import torch  # noqa: E402  (after recording what was already imported)


class Lora:
    def setup(self, ctx: Any) -> None:
        from transformers import LlamaConfig, LlamaForCausalLM

        with torch.device("meta"):
            model = LlamaForCausalLM(LlamaConfig.from_dict(ctx.config))
        ctx.fill_module(model)
        self.device = ctx.device
        self.model: Any = model.eval()
        self.loaded: list[str] = []
        self.lock = threading.Lock()  # the active adapter is model state
        for adapter in ctx.adapters.values():
            self.load_adapter(adapter)

    def load_adapter(self, adapter: Any) -> None:
        from peft import LoraConfig, PeftModel, set_peft_model_state_dict

        fields = LoraConfig.__dataclass_fields__
        config = LoraConfig(**{k: v for k, v in adapter.config.items() if k in fields})
        with self.lock:
            if isinstance(self.model, PeftModel):
                self.model.add_adapter(adapter.name, config)
            else:
                self.model = PeftModel(self.model, config, adapter_name=adapter.name)
            set_peft_model_state_dict(self.model, adapter.tensors, adapter_name=adapter.name)
            self.model.eval()
            self.loaded.append(adapter.name)

    def unload_adapter(self, name: str) -> None:
        with self.lock:
            self.model.delete_adapter(name)
            self.loaded.remove(name)

    def __call__(self, input: Any, call: Any) -> Any:
        ids = torch.tensor([input["ids"]], device=self.device)
        with self.lock, torch.inference_mode():
            switch: Any = contextlib.nullcontext()
            if call.adapter is None and self.loaded:
                switch = self.model.disable_adapter()
            elif call.adapter is not None:
                self.model.set_adapter(call.adapter)
            with switch:
                logits = self.model(input_ids=ids).logits[0, -1]
            loaded = sorted(self.loaded)
        return {"logits": logits.float().cpu().tolist(), "preloaded": PRELOADED, "loaded": loaded}
