"""Example thaw function: text classification with a BERT-style encoder.

Any ``*ForSequenceClassification`` model saved with ``save_pretrained``
(BERT, RoBERTa, DistilBERT, ...) works: its class comes from the pushed
``config.json``, its tokenizer from the files beside the weights
(``ctx.files``). The model is built under ``ctx.empty_weights()``, which makes
parameters on the meta device (no memory, no initialisation) and buffers real:
position ids and token type ids are in no checkpoint, so the model's own
constructor makes them. ``ctx.fill_module`` then makes the streamed weights
the parameters, without a copy. Nothing is downloaded.

Input::

    {"text": "a cold start is fast"}            or {"texts": ["...", "..."]}

Output: per text, ``{"label": best label, "scores": {label: probability}}``
(a list of them for ``texts``).
"""

from __future__ import annotations

import threading
from typing import Any

import torch

MAX_TEXTS = 64
MAX_LENGTH_TOKENS = 512


class Classifier:
    def setup(self, ctx: Any) -> None:
        from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

        self.device = ctx.device
        self.tokenizer = AutoTokenizer.from_pretrained(str(ctx.files))
        config = AutoConfig.from_pretrained(str(ctx.files))
        with ctx.empty_weights():
            model = AutoModelForSequenceClassification.from_config(config)
        ctx.fill_module(model)
        self.model: Any = model.eval()
        self.labels = [config.id2label[i] for i in range(config.num_labels)]
        self.max_length = min(MAX_LENGTH_TOKENS, config.max_position_embeddings)
        # The tokenizer is shared between call threads; encoding is cheap, so one at a time.
        self.lock = threading.Lock()

    def __call__(self, input: Any) -> Any:
        texts, single = _texts(input)
        with self.lock:
            batch = self.tokenizer(
                texts,
                padding=True,
                truncation=True,
                max_length=self.max_length,
                return_tensors="pt",
            )
        with torch.inference_mode():
            logits = self.model(**batch.to(self.device)).logits
        probs = torch.softmax(logits.float(), dim=-1).cpu().tolist()
        rows = [self._row(p) for p in probs]
        return rows[0] if single else rows

    def _row(self, probs: list[float]) -> dict[str, Any]:
        scores = dict(zip(self.labels, probs, strict=True))
        return {"label": max(scores, key=scores.__getitem__), "scores": scores}


def _texts(input: Any) -> tuple[list[str], bool]:
    """The texts to classify, and whether one was sent alone."""
    if isinstance(input, dict) and isinstance(input.get("text"), str):
        return [input["text"]], True
    texts = input.get("texts") if isinstance(input, dict) else None
    if isinstance(texts, list) and texts and all(isinstance(t, str) for t in texts):
        if len(texts) > MAX_TEXTS:
            raise ValueError(f"at most {MAX_TEXTS} texts per call, got {len(texts)}")
        return texts, False
    raise ValueError('input must be {"text": "..."} or {"texts": ["...", ...]}')
