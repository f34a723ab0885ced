"""An LLM in a replica: the model streamed by the snapshotter, its own tokenizer and
chat template from the model's files, and one continuous-batching ``Engine``.

``LLMReplica.stream`` is one call: the prompt's tokens join the running batch, and
text comes back in deltas (never a cut UTF-8 character, never a stop string), each
with how many tokens it holds and when the engine made them, so time to first token
and time per output token are measured here, where tokens are made.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from worker.llm.detokenize import IncrementalDetokenizer
from worker.llm.engine import Engine, EngineError, EngineSizes, FinishReason, Sampling
from worker.llm.stops import StopScanner

DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class LLMOptions:
    """What a deploy says of an LLM function (``[llm]`` in ``thaw.toml``)."""

    dtype: str = "float32"
    max_num_seqs: int = 8
    max_batch_tokens: int = 512
    kv_cache_bytes: int = 64 << 20
    context_length: int | None = None  # None: the model's max_position_embeddings

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, not {self.dtype!r}")


@dataclass(frozen=True)
class TextDelta:
    text: str
    tokens: int  # completion tokens this delta's step brought
    at_s: float  # time.perf_counter() when the engine handed them over
    finish_reason: FinishReason | None = None


class PromptTooLongError(ValueError):
    """The prompt and the tokens asked for do not fit the context length."""


class LLMReplica:
    """Built once in ``setup`` from a thaw ``Context``; ``stream`` from call threads."""

    def __init__(self, ctx: Any, options: LLMOptions) -> None:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        if ctx.files is None:
            raise ValueError("an LLM function needs a model: its config and tokenizer files")
        files = str(ctx.files)
        config = AutoConfig.from_pretrained(files)
        dtype = getattr(torch, options.dtype)
        with ctx.empty_weights():
            model = AutoModelForCausalLM.from_config(
                config, torch_dtype=dtype, attn_implementation="sdpa"
            )
        ctx.fill_module(model)
        self.model = model.eval()
        self.tokenizer: Any = AutoTokenizer.from_pretrained(files)
        self.context_length = options.context_length or int(config.max_position_embeddings)
        sizes = EngineSizes(
            max_num_seqs=options.max_num_seqs,
            max_batch_tokens=options.max_batch_tokens,
            kv_cache_bytes=options.kv_cache_bytes,
        )
        self.engine = Engine(self.model, sizes, eos_token_ids=_eos_ids(config, self.tokenizer))

    # --- prompts -----------------------------------------------------------------
    def chat_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        """The model's own chat template over ``messages``, ready for the answer."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(
                "this model has no chat template (chat_template.jinja or tokenizer_config.json "
                "chat_template): use /v1/completions with a plain prompt"
            )
        encoded: Any = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True
        )
        ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded  # a BatchEncoding
        return list(ids)

    def text_prompt(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, list):
            return list(prompt)
        return list(self.tokenizer(prompt)["input_ids"])

    def max_new_tokens(self, prompt_ids: list[int], requested: int | None) -> int:
        """``requested``, or all the room the context leaves; raises
        ``PromptTooLongError`` when the prompt leaves none or too little."""
        room = self.context_length - len(prompt_ids)
        if room < 1:
            raise PromptTooLongError(
                f"the prompt is {len(prompt_ids)} tokens; this model's context is "
                f"{self.context_length}"
            )
        if requested is not None and requested > room:
            raise PromptTooLongError(
                f"the prompt ({len(prompt_ids)} tokens) and max_tokens ({requested}) exceed "
                f"this model's context of {self.context_length} tokens"
            )
        return requested or room

    # --- one call ------------------------------------------------------------------
    def stream(
        self, prompt_ids: list[int], sampling: Sampling, stop: list[str] | None = None
    ) -> Iterator[TextDelta]:
        """The completion in text deltas; the last has its finish reason. Closing
        it early cancels the request in the engine. Raises ``EngineError``."""
        detok = IncrementalDetokenizer(self.tokenizer)
        scan = StopScanner(stop or [])
        steps = self.engine.generate(prompt_ids, sampling)
        try:
            for step in steps:
                text = scan.feed(detok.add(step.token_ids))
                if scan.stopped:
                    yield TextDelta(text, len(step.token_ids), step.at_s, "stop")
                    return
                if step.finished:
                    text += scan.feed(detok.finish()) + scan.finish()
                    reason = "stop" if scan.stopped else step.finish_reason
                    yield TextDelta(text, len(step.token_ids), step.at_s, reason)
                    return
                yield TextDelta(text, len(step.token_ids), step.at_s)
            raise EngineError("the engine ended the request without a finish")
        finally:
            steps.close()

    def close(self) -> None:
        self.engine.close()


def _eos_ids(config: Any, tokenizer: Any) -> list[int]:
    """End-of-sequence ids from the model's config, else its tokenizer."""
    eos = getattr(config, "eos_token_id", None)
    if eos is None:
        eos = tokenizer.eos_token_id
    ids = eos if isinstance(eos, list) else [eos]
    return [int(i) for i in ids if i is not None]
