"""An LLM in a replica: the model streamed by the snapshotter, its own tokenizer and
chat template from the model's files, and one continuous-batching ``Engine``.

``LLMReplica.stream`` is one call: the prompt's tokens join the running batch, and
text comes back in deltas (never a cut UTF-8 character, never a stop string), each
with how many tokens it holds and when the engine made them, so time to first token
and time per output token are measured here, where tokens are made.

LoRA adapters: those the function lists are added before the engine starts; one a
call names that the function does not list is fetched by the worker and added here
on first use (``load_adapter``, between two steps), beside the others, and dropped
when the worker's adapter cache lets it go (``unload_adapter``). Inside the model
each has a name of thaw's own (a call's ``NAME:TAG`` may hold ``.``, which PEFT's
layer names cannot).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from control_plane.protocol import LLMOptions
from worker.llm.adapters import AdapterRouting, mixable, route_lora_layers
from worker.llm.detokenize import IncrementalDetokenizer, TokenTexts
from worker.llm.engine import (
    Engine,
    EngineError,
    EngineSizes,
    FinishReason,
    Sampling,
    TokenStep,
    prompt_error,
)
from worker.llm.stops import StopScanner
from worker.llm.threads import StepThreads

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TextDelta:
    text: str
    tokens: int  # completion tokens this delta's step brought
    at_s: float  # time.perf_counter() when the engine handed them over
    finish_reason: FinishReason | None = None
    started_s: float | None = None  # when the engine took the request in (TokenStep)
    # asked for (Sampling.logprobs): one per token of the step, OpenAI's chat shape
    # (``TokenTexts.entries``); the text may lag them (a cut character, a stop string)
    logprobs: list[dict[str, Any]] | None = None


def text_delta(
    step: TokenStep, text: str, reason: FinishReason | None, texts: TokenTexts | None
) -> TextDelta:
    """``step`` as a delta of ``text``; with ``texts``, its tokens' logprobs too."""
    logprobs = None if texts is None else texts.entries(step.logprobs)
    return TextDelta(text, len(step.token_ids), step.at_s, reason, step.started_s, logprobs)


class LLMRequestError(ValueError):
    """A call the model cannot serve as asked (the OpenAI routes answer it with 400)."""


class PromptTooLongError(LLMRequestError):
    """The prompt and the tokens asked for do not fit the context length."""


class LLMReplica:
    """Built once in ``setup`` from a thaw ``Context``; ``stream`` from call threads."""

    def __init__(
        self,
        ctx: Any,
        options: LLMOptions,
        adapters: list[Any] | None = None,
        cpu_cores: int | None = None,
    ) -> None:
        """``cpu_cores``: every core the replica may use, for a heavy step on a CPU
        (``worker.llm.threads``); None: torch's threads as set."""
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        if ctx.files is None:
            raise ValueError("an LLM function needs a model: its config and tokenizer files")
        files = str(ctx.files)
        config = AutoConfig.from_pretrained(files)
        stored = _weights_dtype(ctx.weights) or torch.float32
        with ctx.empty_weights():
            model = AutoModelForCausalLM.from_config(
                config, dtype=stored, attn_implementation=_attention_for(config)
            )
        ctx.fill_module(model)
        if options.dtype != "auto" and getattr(torch, options.dtype) != stored:
            model = model.to(getattr(torch, options.dtype))  # one cast, at start
        for adapter in adapters or []:
            model = adapter.add_to(model)
        # Each adapter a call may name, by that name, and its name in the model.
        self._model_names = {a.name: a.name for a in adapters or []}
        self.adapters = sorted(self._model_names)
        self._loads = 0  # adapters loaded on first use, ever: each gets a name of its own
        self.model = model.eval()
        self.tokenizer: Any = AutoTokenizer.from_pretrained(files)
        self.token_texts = TokenTexts(self.tokenizer)
        self.context_length = options.context_length or int(config.max_position_embeddings)
        self.max_tokens_limit = options.max_tokens_limit
        self.kv_cache_mb = options.kv_cache_mb
        sizes = EngineSizes(
            max_num_seqs=options.max_num_seqs,
            max_batch_tokens=options.max_batch_tokens,
            kv_cache_bytes=options.kv_cache_mb << 20,
            share_prefixes=options.prefix_caching,
            # A captured graph runs the adapter layers it was captured with.
            cuda_graphs=options.cuda_graphs and not self.adapters,
        )
        base = model.get_base_model() if self.adapters else model
        self._base = base  # the model the engine runs: PEFT's layers go into it in place
        self._active: str | None = None  # with the gate: the adapter the model runs now
        threads = None
        if cpu_cores is not None:
            narrow = torch.get_num_threads()
            wide = max(narrow, cpu_cores)
            threads = StepThreads(narrow, wide, options.wide_step_ms_per_token)
        generation = _generation_config(files)
        self.sampling_defaults = sampling_defaults(generation)
        eos_ids = _eos_ids(config, self.tokenizer, generation)
        self.routing = self._adapter_routing(options)
        self.engine = Engine(
            base, sizes, eos_token_ids=eos_ids, threads=threads, adapter_routing=self.routing
        )
        for name in self._model_names.values():
            self.engine.add_adapter(name)
        # Without routing, calls of one adapter at a time, the model switched between
        self.gate: AdapterGate | None = None
        if self.routing is None:
            self._switch_adapter(None)  # the gate starts on the base model: so does the model
            self.gate = AdapterGate(self._switch_adapter)

    def _adapter_routing(self, options: LLMOptions) -> AdapterRouting | None:
        """Each call's tokens routed through its own adapter, in one batch
        (``worker.llm.adapters``), unless ``mixed_adapters`` is off or a listed adapter
        is of a kind that cannot be mixed (then one at a time). With no adapters listed
        the steps are routed all the same, for those loaded on first use."""
        if not options.mixed_adapters:
            return None
        refused = mixable(self.model) if self.adapters else None
        if refused is not None:
            log.warning("this replica runs one adapter at a time in its batch: %s", refused)
            return None
        routing = AdapterRouting(self.model.device)
        if self.adapters:
            route_lora_layers(self.model, routing)
        return routing

    def adapter_waiting(self) -> int:
        """Calls waiting for their adapter's turn (none when adapters mix)."""
        return 0 if self.gate is None else self.gate.waiting()

    def _model_name(self, adapter: str | None) -> str | None:
        """The name in the model of the adapter a call names (None: the base model);
        raises ``LLMRequestError`` for one not loaded."""
        if adapter is None:
            return None
        name = self._model_names.get(adapter)
        if name is None:
            raise LLMRequestError(
                f"unknown adapter {adapter!r}; this function has {self.adapters or 'none'}"
            )
        return name

    def _turn(self, name: str | None) -> AbstractContextManager[None]:
        """While held, the call may run through adapter ``name`` (its name in the model):
        at once when adapters mix, else once the gate gives it the model."""
        return nullcontext() if self.gate is None else self.gate.hold(name)

    # --- adapters loaded on first use (``worker.adapters.AdapterCache``) ------------
    # Locks, always taken in this order: the adapter cache's (a load or an unload), the
    # gate's (a switch), the engine's step lock (``Engine.model_change``).
    def load_adapter(self, adapter: Any) -> None:
        """Add ``adapter`` (a ``worker.sdk.Adapter`` the worker fetched for a call that
        named it) to the model, between two steps, beside the adapters loaded; raises
        ``LLMRequestError`` saying why when it cannot be, and then nothing is added."""
        if self.engine.cuda_graphs:
            raise LLMRequestError(
                f"adapter {adapter.name!r} cannot be loaded on first use: this function's "
                "steps replay CUDA graphs, which keep the layers they were captured with; "
                "list it under [[adapters]] in thaw.toml (then steps run eagerly) or set "
                "[llm] cuda_graphs = false"
            )
        self._loads += 1
        name = f"loaded_{self._loads}"
        with self.engine.model_change():
            try:
                model = dataclasses.replace(adapter, name=name).add_to(self.model)
            except Exception as exc:
                self._drop_from_model(name)
                raise LLMRequestError(
                    f"adapter {adapter.name!r} does not fit this model: {exc}"
                ) from None
            refused = mixable(model) if self.routing is not None else None
            self.model = model
            if refused is not None:
                self._drop_from_model(name)
                raise LLMRequestError(
                    f"adapter {adapter.name!r} cannot run in one batch beside other "
                    f"adapters: {refused}; list it under [[adapters]] in thaw.toml (the "
                    "function then runs one adapter at a time)"
                )
            self._model_names[adapter.name] = name
            self.adapters = sorted(self._model_names)
            if self.routing is not None:
                route_lora_layers(model, self.routing)
            elif self.gate is not None:  # the new adapter's layers as the rest are
                self._set_active(self._active)
        self.engine.add_adapter(name)

    def unload_adapter(self, adapter: str) -> None:
        """Drop ``adapter`` (as a call names it) from the model, between two steps; none
        of its calls runs (``AdapterCache`` unloads no adapter in use)."""
        name = self._model_names.pop(adapter, None)
        if name is None:
            return
        self.adapters = sorted(self._model_names)
        self.engine.remove_adapter(name)
        if self.gate is not None:  # before the step lock: a switch holds the gate for it
            self.gate.forget(name)
        with self.engine.model_change():
            self._drop_from_model(name)
            if self.gate is not None and self._active == name:  # the model ran it last
                self._set_active(None)

    def _drop_from_model(self, name: str) -> None:
        """Delete adapter ``name`` from the model, wherever it got to: a load that failed
        part way may have put its layers into the model before PEFT's wrapper was made
        (a first adapter's tensors of the wrong shape)."""
        from peft import PeftModel
        from peft.tuners.tuners_utils import BaseTunerLayer

        model = self.model
        if isinstance(model, PeftModel):
            if name in model.peft_config:
                others = [n for n in model.peft_config if n != name]
                if others and name in model.active_adapters:
                    model.set_adapter(others[0])  # PEFT warns when the active one is deleted
                model.delete_adapter(name)
            return
        for module in self._base.modules():
            if isinstance(module, BaseTunerLayer) and name in getattr(module, "lora_A", {}):
                module.delete_adapter(name)
        configs = getattr(self._base, "peft_config", None)  # PEFT's tuner put it there
        if isinstance(configs, dict):
            configs.pop(name, None)
            if not configs:
                del self._base.peft_config

    # --- prompts -----------------------------------------------------------------
    def chat_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        """The model's own chat template over ``messages``, ready for the answer."""
        from jinja2 import TemplateError

        if not getattr(self.tokenizer, "chat_template", None):
            raise LLMRequestError(
                "this model has no chat template (chat_template.jinja or tokenizer_config.json "
                "chat_template): use /v1/completions with a plain prompt"
            )
        try:
            encoded: Any = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True
            )
        except TemplateError as exc:  # the template's own raise_exception: roles, order
            raise LLMRequestError(
                f"the model's chat template refused the messages: {exc}"
            ) from None
        ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded  # a BatchEncoding
        return self._checked(list(ids))

    def text_prompt(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, list):
            return self._checked(list(prompt))
        return self._checked(list(self.tokenizer(prompt)["input_ids"]))

    def _checked(self, prompt_ids: list[int]) -> list[int]:
        """``prompt_ids``, or ``LLMRequestError`` for a prompt that would fail the batch
        it joined (no tokens, an id outside the vocabulary): one caller's bad prompt
        must not end every other caller's stream."""
        refused = prompt_error(prompt_ids, self.engine.vocab_size)
        if refused is not None:
            raise LLMRequestError(refused)
        return prompt_ids

    def max_new_tokens(self, prompt_ids: list[int], requested: int | None) -> int:
        """``requested``, or all the room the context and the KV cache leave; raises
        ``PromptTooLongError`` when the prompt leaves none or too little."""
        room = self.context_length - len(prompt_ids)
        if room < 1:
            raise PromptTooLongError(
                f"the prompt is {len(prompt_ids)} tokens; this model's context is "
                f"{self.context_length}"
            )
        if requested is not None and requested > self.max_tokens_limit:
            raise LLMRequestError(
                f"max_tokens is {requested}; this function allows at most "
                f"{self.max_tokens_limit} ([llm] max_tokens_limit)"
            )
        if requested is not None and requested > room:
            raise PromptTooLongError(
                f"the prompt ({len(prompt_ids)} tokens) and max_tokens ({requested}) exceed "
                f"this model's context of {self.context_length} tokens"
            )
        cache_room = self._cache_room(prompt_ids, requested)
        return requested or min(room, cache_room, self.max_tokens_limit)

    def _cache_room(self, prompt_ids: list[int], requested: int | None) -> int:
        """The most tokens the KV cache lets one sequence make after ``prompt_ids``;
        raises ``PromptTooLongError`` when it is less than one, or than ``requested``.
        A sequence the cache cannot hold would fail the batch it joined."""
        held = self.engine.sequence_tokens
        if held is None:  # sliding windows only: the context bounds it
            return self.context_length
        room = held - len(prompt_ids) + 1  # the last token made is never fed back
        kv = (
            f"this function's KV cache holds {held} tokens of one sequence "
            f"([llm] kv_cache_mb = {self.kv_cache_mb})"
        )
        if room < 1:
            raise PromptTooLongError(f"the prompt is {len(prompt_ids)} tokens; {kv}")
        if requested is not None and requested > room:
            raise PromptTooLongError(
                f"the prompt ({len(prompt_ids)} tokens) and max_tokens ({requested}) need "
                f"{len(prompt_ids) + requested - 1} tokens of KV cache; {kv}: ask for at most "
                f"{room} tokens, or raise kv_cache_mb"
            )
        return room

    # --- one call ------------------------------------------------------------------
    def stream(
        self,
        prompt_ids: list[int],
        sampling: Sampling,
        stop: list[str] | None = None,
        adapter: str | None = None,
    ) -> Iterator[TextDelta]:
        """The completion in text deltas, through ``adapter`` (None: the base model);
        the last has its finish reason. Closing it early cancels the request in the
        engine. Raises ``EngineError``, ``LLMRequestError`` for an unknown adapter."""
        name = self._model_name(adapter)
        with self._turn(name):
            yield from self._stream(prompt_ids, sampling, stop, name)

    def _stream(
        self,
        prompt_ids: list[int],
        sampling: Sampling,
        stop: list[str] | None,
        adapter: str | None,
    ) -> Iterator[TextDelta]:
        detok = IncrementalDetokenizer(self.tokenizer, prompt_ids=prompt_ids)
        scan = StopScanner(stop or [])
        texts = None if sampling.logprobs is None else self.token_texts
        steps = self.engine.generate(prompt_ids, sampling, adapter)
        try:
            for step in steps:
                text = scan.feed(detok.add(step.token_ids))
                if scan.stopped:
                    yield text_delta(step, text, "stop", texts)
                    return
                if step.finished:
                    text += scan.feed(detok.finish()) + scan.finish()
                    reason = "stop" if scan.stopped else step.finish_reason
                    yield text_delta(step, text, reason, texts)
                    return
                yield text_delta(step, text, None, texts)
            raise EngineError("the engine ended the request without a finish")
        finally:
            steps.close()

    @contextmanager
    def pushed(
        self,
        prompt_ids: list[int],
        sampling: Sampling,
        stop: list[str] | None,
        adapter: str | None,
        on_delta: Callable[[TextDelta], None],
        on_end: Callable[[BaseException | None], None],
    ) -> Iterator[None]:
        """``stream`` pushed: while the caller stays in this block (holding ``adapter``'s
        turn), the engine's router hands each delta to ``on_delta`` and then calls
        ``on_end`` once, with the error that ended the call or None. Leaving the block
        early cancels the request; nothing is handed over after it."""
        name = self._model_name(adapter)
        with self._turn(name):
            request_id = self.engine.new_request_id(name)
            texts = None if sampling.logprobs is None else self.token_texts
            text = PushedText(self, request_id, prompt_ids, stop, on_delta, on_end, texts)
            self.engine.push(prompt_ids, sampling, text.sink, request_id, name)
            try:
                yield
            finally:
                text.cancel()

    def _switch_adapter(self, name: str | None) -> None:
        """Make ``name`` the model's active adapter (None: the base model alone);
        called by the gate while no call runs. A cancelled request may still be in the
        engine for a step: its keys and values would be another adapter's under its own
        prefix key, so the switch waits for it to leave."""
        if not self.adapters:
            return
        if not self.engine.wait_idle():
            log.warning("requests of the last adapter are still in the engine; switching")
        with self.engine.model_change():
            self._set_active(name)

    def _set_active(self, name: str | None) -> None:
        """With the step lock held (``Engine.model_change``)."""
        self._active = name
        lora = self.model.base_model  # peft's LoraModel: its layers are in the model
        if name is None:
            lora.disable_adapter_layers()
        else:
            lora.enable_adapter_layers()
            self.model.set_adapter(name)

    def close(self) -> None:
        self.engine.close()


class PushedText:
    """One pushed call's text: each step the engine's router hands over, detokenized
    with stop strings applied, as ``LLMReplica._stream`` makes it; a ``TextDelta`` to
    ``on_delta``, then ``on_end`` once. Steps are taken under a lock, so after
    ``cancel`` returns nothing more is handed over."""

    def __init__(
        self,
        replica: LLMReplica,
        request_id: str,
        prompt_ids: list[int],
        stop: list[str] | None,
        on_delta: Callable[[TextDelta], None],
        on_end: Callable[[BaseException | None], None],
        texts: TokenTexts | None = None,
    ) -> None:
        """``texts``: the call asked for logprobs (``text_delta``)."""
        self.request_id = request_id
        self._texts = texts
        self._engine = replica.engine
        self._detok = IncrementalDetokenizer(replica.tokenizer, prompt_ids=prompt_ids)
        self._scan = StopScanner(stop or [])
        self._on_delta = on_delta
        self._on_end = on_end
        self._lock = threading.Lock()
        self._ended = False

    def sink(self, item: TokenStep | EngineError) -> None:
        with self._lock:
            if self._ended:
                return
            try:
                if isinstance(item, EngineError):
                    raise item
                self._step(item)
            except Exception as exc:
                self._engine.cancel(self.request_id)
                self._end(exc)

    def _step(self, step: TokenStep) -> None:
        scan = self._scan
        text = scan.feed(self._detok.add(step.token_ids))
        if scan.stopped:
            self._engine.cancel(self.request_id)  # a stop string ends it here
            self._on_delta(text_delta(step, text, "stop", self._texts))
            self._end(None)
        elif step.finished:
            text += scan.feed(self._detok.finish()) + scan.finish()
            reason = "stop" if scan.stopped else step.finish_reason
            self._on_delta(text_delta(step, text, reason, self._texts))
            self._end(None)
        else:
            self._on_delta(text_delta(step, text, None, self._texts))

    def _end(self, error: BaseException | None) -> None:
        self._ended = True
        self._on_end(error)

    def cancel(self) -> None:
        """End the request unless it has ended; nothing is handed over after this."""
        with self._lock:
            ended, self._ended = self._ended, True
        if not ended:
            self._engine.cancel(self.request_id)


_WAKE_S = 0.1
_FORGOTTEN = object()  # the gate's adapter was dropped from the model: none is active


class AdapterGate:
    """Calls of one adapter at a time in the running batch (the LoRA layers apply the
    active adapter to every sequence). A call for another adapter waits until the
    running calls end; calls arriving after it wait behind it, so no adapter starves.
    ``switch`` makes an adapter active, with no call running."""

    def __init__(self, switch: Callable[[str | None], None]) -> None:
        self._switch = switch
        self._cond = threading.Condition()
        self._active: Any = None  # an adapter's name, None (the base model) or _FORGOTTEN
        self._running = 0
        self._waiting: deque[tuple[object, str | None]] = deque()

    @contextmanager
    def hold(self, adapter: str | None) -> Iterator[None]:
        ticket = object()
        with self._cond:
            self._waiting.append((ticket, adapter))
            try:
                while not self._may_enter(ticket, adapter):
                    self._cond.wait(_WAKE_S)  # a cancel raised in this thread lands here
            finally:
                self._waiting.remove((ticket, adapter))
            if adapter != self._active:
                self._switch(adapter)
                self._active = adapter
            self._running += 1
            self._cond.notify_all()  # those behind, of the same adapter, may follow
        try:
            yield
        finally:
            with self._cond:
                self._running -= 1
                self._cond.notify_all()

    def waiting(self) -> int:
        """Calls waiting for their adapter's turn."""
        with self._cond:
            return len(self._waiting)

    def forget(self, adapter: str) -> None:
        """``adapter`` is no longer in the model: a call of the next adapter switches,
        whichever it is. No call of it is running."""
        with self._cond:
            if self._active == adapter:
                self._active = _FORGOTTEN

    def _may_enter(self, ticket: object, adapter: str | None) -> bool:
        if self._running == 0:
            return self._waiting[0][0] is ticket
        if adapter != self._active:
            return False
        for waiting, other in self._waiting:  # none ahead waits for another adapter
            if waiting is ticket:
                return True
            if other != self._active:
                return False
        return True


def _attention_for(config: Any) -> str:
    """``sdpa``, or ``eager`` for an architecture that transformers will not run on
    ``sdpa`` (its scores are capped or have sinks: Gemma 2, gpt-oss), whose steps then
    come to ``worker.llm.attention`` all the same. Raises ``ValueError`` for an
    architecture continuous batching cannot run."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        model_class: Any = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    except KeyError:
        raise ValueError(
            f"model type {config.model_type!r} is not a causal language model transformers "
            "knows: an LLM function serves a model AutoModelForCausalLM loads"
        ) from None
    if not getattr(model_class, "_supports_attention_backend", False):
        raise ValueError(
            f"{model_class.__name__} ({config.model_type!r}) cannot run on continuous "
            "batching: its attention takes no paged KV cache in transformers"
        )
    return "sdpa" if getattr(model_class, "_supports_sdpa", False) else "eager"


def _weights_dtype(weights: Any) -> Any:
    """The dtype of the model's floating-point weights as pushed (None: none)."""
    for tensor in weights.values():
        if tensor.is_floating_point():
            return tensor.dtype
    return None


def _generation_config(files: str) -> dict[str, Any]:
    """The model's ``generation_config.json`` ({} when it has none)."""
    path = Path(files) / "generation_config.json"
    if not path.is_file():
        return {}
    try:
        generation = json.loads(path.read_text())
    except ValueError as exc:
        raise ValueError(f"the model's generation_config.json is not JSON: {exc}") from None
    if not isinstance(generation, dict):
        raise ValueError("the model's generation_config.json is not a JSON object")
    return generation


def _eos_ids(config: Any, tokenizer: Any, generation: dict[str, Any]) -> list[int]:
    """End-of-sequence ids: the config's (else the tokenizer's), and those of the
    model's ``generation_config.json``, where a chat model names its end of turn
    (Llama 3's ``<|eot_id|>``, Gemma's ``<end_of_turn>``): ``generate`` and vLLM stop
    on them too, and without them a chat answer runs on into the next turn."""
    ids = _ids(getattr(config, "eos_token_id", None))
    if not ids:
        ids = _ids(tokenizer.eos_token_id)
    ids += [i for i in _ids(generation.get("eos_token_id")) if i not in ids]
    return ids


#: The sampling a call leaves out, when the model's generation_config.json names none.
OPENAI_SAMPLING: dict[str, float] = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "repetition_penalty": 1.0,
    "min_p": 0.0,
}


def sampling_defaults(generation: dict[str, Any]) -> dict[str, float]:
    """What a call that leaves out ``temperature``, ``top_p``, ``top_k``,
    ``repetition_penalty`` or ``min_p`` samples with: the values the model's authors
    put in its ``generation_config.json`` (Llama 3 Instruct: temperature 0.6, top_p
    0.9; Qwen2.5 Instruct: 0.7, 0.8, top_k 20, repetition_penalty 1.05), else
    OpenAI's. vLLM (``--generation-config auto``) and SGLang do the same; like them,
    ``do_sample`` is not read: a request asks for greedy with ``temperature: 0``.
    Raises ``ValueError`` naming a value no call could sample with."""
    out = dict(OPENAI_SAMPLING)
    for name in out:
        value = generation.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"the model's generation_config.json has {name} = {value!r}")
        out[name] = value
    if name_error := _sampling_error(out):
        raise ValueError(f"the model's generation_config.json has {name_error}")
    return out


def _sampling_error(values: dict[str, float]) -> str | None:
    temperature, top_p, top_k = values["temperature"], values["top_p"], values["top_k"]
    if not (math.isfinite(temperature) and temperature >= 0):
        return f"temperature = {temperature!r} (a number >= 0)"
    if not 0 < top_p <= 1:
        return f"top_p = {top_p!r} (in (0, 1])"
    if not math.isfinite(top_k) or top_k != int(top_k) or top_k < 0:
        return f"top_k = {top_k!r} (an integer >= 0)"
    repetition, min_p = values["repetition_penalty"], values["min_p"]
    if not (math.isfinite(repetition) and repetition > 0):
        return f"repetition_penalty = {repetition!r} (a number > 0)"
    if not 0 <= min_p <= 1:
        return f"min_p = {min_p!r} (in [0, 1])"
    return None


def _ids(eos: Any) -> list[int]:
    values = eos if isinstance(eos, list) else [eos]
    return [int(i) for i in values if i is not None]
