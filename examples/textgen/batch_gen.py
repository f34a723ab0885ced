"""Batched generation for ``TextGen.batch``: several prompts, one forward pass per token.

Prompts are left-padded to the longest, with an attention mask hiding the
padding and position ids counting only real tokens, so each row attends and
is positioned as it would be alone; one KV cache serves the batch. A row
stops at end-of-sequence or its own ``max_tokens``; the batch stops when
every row has. Each step yields one ``{"text": piece}`` (or ``None``) per
request; the generator returns each request's ``{"text", "tokens"}``, what a
caller that does not stream gets (``worker/sdk.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class _Row:
    index: int  # the request's place in the batch
    params: dict[str, Any]
    generator: torch.Generator
    produced: list[int] = field(default_factory=list)
    text: str = ""
    pieces: int = 0
    done: bool = False


def generate_batch(fn: Any, requests: list[Any], adapter: str | None) -> Iterator[list[Any]]:
    """``requests``: each one's params, or the ``Exception`` that fails it."""
    yield [r if isinstance(r, Exception) else None for r in requests]  # bad inputs fail now
    rows = [
        _Row(i, r, torch.Generator(device="cpu").manual_seed(r["seed"]))
        for i, r in enumerate(requests)
        if not isinstance(r, Exception)
    ]
    if rows:
        yield from _steps(fn, rows, len(requests), adapter)
    by_index = {row.index: row for row in rows}
    return [r if isinstance(r, Exception) else _final(by_index[i]) for i, r in enumerate(requests)]


def _final(row: _Row) -> dict[str, Any]:
    return {"text": row.text, "tokens": row.pieces}


def _steps(fn: Any, rows: list[_Row], n: int, adapter: str | None) -> Iterator[list[Any]]:
    tok = fn.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    prompts = [tok(row.params["prompt"]).input_ids for row in rows]
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=fn.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=fn.device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    longest = max(row.params["max_tokens"] for row in rows)
    with fn.lock, torch.inference_mode(), fn._adapter(adapter):
        past = None
        for _ in range(longest):
            out = fn.model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=past,
                use_cache=True,
            )
            past = out.past_key_values
            logits = out.logits[:, -1].float().cpu() + fn.printable
            step: list[Any] = [None] * n
            next_ids = [_advance(fn, row, logits[k], step, pad) for k, row in enumerate(rows)]
            yield step
            if all(row.done for row in rows):
                return
            ids = torch.tensor([[t] for t in next_ids], device=fn.device)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            positions = positions[:, -1:] + 1


def _advance(fn: Any, row: _Row, logits: torch.Tensor, step: list[Any], pad: int) -> int:
    """Pick the row's next token, put its new text in ``step``; the id to feed next."""
    from app import _pick

    if row.done:
        return pad  # fed and ignored: a finished row only keeps the batch's shape
    next_id = _pick(logits, row.params["temperature"], row.generator)
    if next_id == fn.tokenizer.eos_token_id:
        row.done = True
        return pad
    row.produced.append(next_id)
    full = fn.tokenizer.decode(row.produced)
    piece, row.text = full[len(row.text) :], full
    if piece:
        step[row.index] = {"text": piece}
        row.pieces += 1
    row.done = len(row.produced) >= row.params["max_tokens"]
    return next_id
