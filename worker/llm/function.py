"""The entry of every LLM function (``spec.LLM_ENTRY``): thaw's own code over the
user's pushed model, built with the function's ``[llm]`` options.

A call's input is what the OpenAI routes make of a request
(``control_plane.openai.calls``)::

    {"messages": [{"role": "user", "content": "Hi"}]}   or   {"prompt": "Once"}
    + "max_tokens" (None: all the context leaves), "temperature", "top_p",
      "top_k" (each left out or None: the model's generation_config.json, else
      OpenAI's: ``serve.sampling_defaults``), "repetition_penalty" and "min_p"
      (the same), "frequency_penalty" and "presence_penalty" (0: off), "seed",
      "stop" (a list of strings), "ignore_eos" (true: run to max_tokens past the
      model's end of text, as load generators ask), "logprobs" (n, 0 to 20: each
      token's log probability and the n most likely tokens' at its position, the
      model's own before any sampling value: ``worker.llm.logprobs``), "logit_bias"
      (OpenAI's: {"token id": bias from -100 to 100}). Any other key is refused.

A streaming call yields ``{"text": delta, "tokens": n}`` as tokens are made, the
first also with ``"prompt_tokens"``, the last with ``"finish_reason"`` and
``"usage"``; any other call returns
``{"text": all of it, "tokens": n, "finish_reason": ..., "usage": {...}}``. A call
that asked for logprobs has ``"logprobs"`` beside its tokens, one entry per token in
OpenAI's chat shape (``{"token", "logprob", "bytes", "top_logprobs"}``). Either way the call's
``usage`` has its prompt and completion tokens and its ``timings_ms``, all measured
here where tokens are made, from the call's start in the replica: ``engine_queue``
(until the engine took the request into its batch), ``ttft`` (the first token),
``tpot`` (the mean time per output token after it) and ``itl_p50`` / ``itl_p99``
(the inter-token gaps).

A call naming an adapter runs through that LoRA adapter, in the same batch as calls
naming others or none (``worker.llm.adapters``); with ``mixed_adapters`` off, or an
adapter that cannot be mixed, the batch runs one adapter at a time (``AdapterGate``):
calls for another adapter wait until the running ones end, then the model is switched.
An adapter the function does not list, pushed to the store, is loaded on the first
call that names it (``load_adapter``), as for any function.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

from control_plane.protocol import MAX_STOP_CHARS, MAX_STOP_SEQUENCES, EngineStats, LLMOptions
from worker.llm.engine import EngineDeadError, Sampling, bias_error
from worker.llm.logprobs import MAX_TOP_LOGPROBS
from worker.llm.serve import LLMReplica, LLMRequestError, TextDelta


class LLMFunction:
    def __init__(self, options: LLMOptions | None = None, cpu_cores: int | None = None) -> None:
        self.options = options or LLMOptions()
        self.cpu_cores = cpu_cores  # every core the replica may use (worker.llm.threads)
        self.llm: LLMReplica | None = None

    def setup(self, ctx: Any) -> None:
        adapters = list(ctx.adapters.values())
        self.llm = LLMReplica(ctx, self.options, adapters=adapters, cpu_cores=self.cpu_cores)

    def __call__(self, input: Any, call: Any) -> Any:
        llm = self._llm()
        started = time.perf_counter()
        prompt, sampling, stop = self._prepare(llm, input, call)
        deltas = _timed(llm.stream(prompt, sampling, stop, call.adapter), started, call)
        if call.stream:
            return (_chunk(d, call.usage, i == 0) for i, d in enumerate(deltas))
        text, tokens, reason = [], 0, None
        logprobs: list[dict[str, Any]] = []
        for delta in deltas:
            text.append(delta.text)
            tokens += delta.tokens
            reason = delta.finish_reason
            logprobs += delta.logprobs or []
        out = {"text": "".join(text), "tokens": tokens, "finish_reason": reason}
        if sampling.logprobs is not None:
            out["logprobs"] = logprobs
        return {**out, "usage": dict(call.usage)}

    def push_call(self, input: Any, call: Any, out: Any) -> None:
        """A streamed call pushed (``worker.pushed_calls``): the chunks ``__call__``'s
        stream would yield are handed to ``out.chunk`` by the engine's router as steps
        are made, then ``out.end()``; returns once ``out.wait()`` says the end was sent,
        raises what ended the call early. No thread is woken per token."""
        llm = self._llm()
        started = time.perf_counter()
        prompt, sampling, stop = self._prepare(llm, input, call)
        timing = _TokenTiming(started, call)
        errors: list[BaseException] = []
        first = True

        def on_delta(delta: TextDelta) -> None:
            nonlocal first
            timing.add(delta)
            out.chunk(_chunk(delta, call.usage, first))
            first = False

        def on_end(error: BaseException | None) -> None:
            if error is not None:
                errors.append(error)
            timing.finish()
            out.end()

        try:
            with llm.pushed(prompt, sampling, stop, call.adapter, on_delta, on_end):
                out.wait()
        finally:
            timing.finish()  # a call cut short: what it made (nothing pushes after the block)
        if errors:
            raise errors[0]

    def load_adapter(self, adapter: Any) -> None:
        """A call named an adapter the function does not list: the worker fetched it
        (``worker.adapters.AdapterCache``); it joins the model, beside the others."""
        self._llm().load_adapter(adapter)

    def unload_adapter(self, name: str) -> None:
        """The worker's adapter cache let ``name`` go (no call of it runs)."""
        self._llm().unload_adapter(name)

    def add_step_listener(self, listener: Any) -> None:
        """Call ``listener`` after each engine step's pushed chunks (``Engine``)."""
        self._llm().engine.add_step_listener(listener)

    def _llm(self) -> LLMReplica:
        if self.llm is None:
            raise RuntimeError("the LLM function was called before its setup")
        return self.llm

    def _prepare(
        self, llm: LLMReplica, input: Any, call: Any
    ) -> tuple[list[int], Sampling, list[str]]:
        """The call's prompt tokens, sampling and stop strings; its usage started."""
        request = _request(input)
        if "messages" in request:
            prompt = llm.chat_prompt(request["messages"])
        else:
            prompt = llm.text_prompt(request["prompt"])
        max_new_tokens = llm.max_new_tokens(prompt, request["max_tokens"])
        asked = {name: request[name] for name in llm.sampling_defaults}
        values = {n: llm.sampling_defaults[n] if v is None else v for n, v in asked.items()}
        try:
            sampling = Sampling(
                max_new_tokens=max_new_tokens,
                temperature=values["temperature"],
                top_p=values["top_p"],
                top_k=int(values["top_k"]),
                repetition_penalty=values["repetition_penalty"],
                min_p=values["min_p"],
                frequency_penalty=request["frequency_penalty"] or 0.0,
                presence_penalty=request["presence_penalty"] or 0.0,
                seed=request["seed"],
                ignore_eos=request["ignore_eos"],
                logprobs=request["logprobs"],
                logit_bias=request["logit_bias"],
            )
        except ValueError as exc:
            raise LLMRequestError(str(exc)) from None
        refused = bias_error(sampling, llm.engine.vocab_size)
        if refused is not None:
            raise LLMRequestError(refused)
        call.usage["prompt_tokens"] = len(prompt)
        call.usage["completion_tokens"] = 0
        return prompt, sampling, request["stop"]

    def engine_stats(self) -> EngineStats | None:
        """The engine's load now (the worker reports it: ``worker.engine_report``)."""
        llm = self.llm
        if llm is None:
            return None
        if llm.engine.dead is not None:  # the replica ends (worker.engine_report)
            raise EngineDeadError(f"the engine could not start again: {llm.engine.dead}")
        running, waiting, kv_usage = llm.engine.load()
        gate = llm.engine.capture_gate
        return EngineStats(
            running=running,
            waiting=waiting + llm.adapter_waiting(),
            kv_cache_usage=kv_usage,
            peak_running=llm.engine.peak_active,
            aborted=llm.engine.aborted,
            graph_captures=0 if gate is None else gate.captures,
            graph_eager_steps=0 if gate is None else gate.eager_steps,
            prefix_cache_queries=llm.engine.prefix_queried_tokens,
            prefix_cache_hits=llm.engine.prefix_hit_tokens,
        )

    def close(self) -> None:
        if self.llm is not None:
            self.llm.close()


def _chunk(delta: TextDelta, usage: dict[str, int], first: bool) -> dict[str, Any]:
    """A stream's output; the first has the prompt's tokens (usage on every chunk,
    ``stream_options.continuous_usage_stats``, needs them), the last the finish reason
    and the call's usage."""
    chunk: dict[str, Any] = {"text": delta.text, "tokens": delta.tokens}
    if delta.logprobs is not None:
        chunk["logprobs"] = delta.logprobs
    if first:
        chunk["prompt_tokens"] = usage["prompt_tokens"]
    if delta.finish_reason is not None:
        chunk["finish_reason"] = delta.finish_reason
        chunk["usage"] = dict(usage)
    return chunk


def _timed(deltas: Iterator[TextDelta], started: float, call: Any) -> Iterator[TextDelta]:
    """``deltas``, counted and timed as they pass (``_TokenTiming``), also for a call
    cut short."""
    timing = _TokenTiming(started, call)
    try:
        for delta in deltas:
            timing.add(delta)
            yield delta
    finally:
        deltas.close()  # type: ignore[attr-defined]  # a generator: cancels the request
        timing.finish()


class _TokenTiming:
    """A call's completion tokens counted and timed as its deltas come: ``ttft`` from
    the call's start, ``engine_queue`` until the engine took the request in, ``tpot``
    the mean gap after the first token and ``itl_p50`` / ``itl_p99`` the inter-token
    gaps (a step of n tokens: n equal gaps), in the call's timings."""

    def __init__(self, started: float, call: Any) -> None:
        self.started = started
        self.call = call
        self.first: float | None = None
        self.last: float | None = None
        self.tokens = 0
        self.gaps_ms: list[float] = call.token_gaps_ms  # reported with the call's end

    def add(self, delta: TextDelta) -> None:
        timings = self.call.timings_ms
        if delta.started_s is not None and "engine_queue" not in timings:
            timings["engine_queue"] = max(0.0, delta.started_s - self.started) * 1000
        if not delta.tokens:
            return
        if self.first is None or self.last is None:
            self.first = delta.at_s
            timings["ttft"] = (self.first - self.started) * 1000
            self.gaps_ms += [0.0] * (delta.tokens - 1)  # tokens of one step come at once
        else:
            gap_ms = (delta.at_s - self.last) * 1000 / delta.tokens
            self.gaps_ms += [gap_ms] * delta.tokens
        self.last = delta.at_s
        self.tokens += delta.tokens
        self.call.usage["completion_tokens"] = self.tokens

    def finish(self) -> None:
        """The per-token figures, once the deltas have ended (again: the same)."""
        if self.first is not None and self.last is not None and self.tokens > 1:
            timings = self.call.timings_ms
            timings["tpot"] = (self.last - self.first) * 1000 / (self.tokens - 1)
            timings["itl_p50"] = _percentile(self.gaps_ms, 50)
            timings["itl_p99"] = _percentile(self.gaps_ms, 99)


def _percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile of a non-empty list."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def _request(input: Any) -> dict[str, Any]:
    """The call's input, checked (the OpenAI routes send it well formed; a caller of
    the plain invoke route may not)."""
    if not isinstance(input, dict):
        raise LLMRequestError("an LLM call's input is an object with messages or prompt")
    unknown = sorted(set(input) - _INPUT_KEYS)
    if unknown:
        raise LLMRequestError(
            f"an LLM call's input has no {', '.join(map(repr, unknown))}: it takes "
            + ", ".join(sorted(_INPUT_KEYS))
        )
    has_messages, has_prompt = "messages" in input, "prompt" in input
    if has_messages == has_prompt:
        raise LLMRequestError('an LLM call\'s input has either "messages" or "prompt"')
    out: dict[str, Any] = {}
    if has_messages:
        out["messages"] = _messages(input["messages"])
    else:
        prompt = input["prompt"]
        ok = isinstance(prompt, str) or (
            isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt)
        )
        if not ok:
            raise LLMRequestError('"prompt" is a string or a non-empty list of token ids')
        out["prompt"] = prompt
    max_tokens = input.get("max_tokens")
    if max_tokens is not None and (not _is_int(max_tokens) or max_tokens < 1):
        raise LLMRequestError('"max_tokens" is a positive integer')
    out["max_tokens"] = max_tokens
    for name in _NUMBERS:
        out[name] = _number(input, name)
    top_k = input.get("top_k")
    if top_k is not None and not (_is_int(top_k) and top_k >= -1):
        raise LLMRequestError('"top_k" is an integer: the k most likely tokens (0 or -1: all)')
    out["top_k"] = None if top_k is None else max(0, top_k)
    seed = input.get("seed")
    if seed is not None and not (_is_int(seed) and 0 <= seed < 2**63):
        raise LLMRequestError('"seed" is an integer from 0 to 2**63 - 1')
    out["seed"] = seed
    stop = input.get("stop") or []
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise LLMRequestError('"stop" is a list of strings')
    stop = [s for s in stop if s]
    if len(stop) > MAX_STOP_SEQUENCES or any(len(s) > MAX_STOP_CHARS for s in stop):
        raise LLMRequestError(
            f'"stop" holds at most {MAX_STOP_SEQUENCES} strings of at most '
            f"{MAX_STOP_CHARS} characters"
        )
    out["stop"] = stop
    ignore_eos = input.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise LLMRequestError('"ignore_eos" is true or false')
    out["ignore_eos"] = ignore_eos
    logprobs = input.get("logprobs")
    if logprobs is not None and not (_is_int(logprobs) and 0 <= logprobs <= MAX_TOP_LOGPROBS):
        raise LLMRequestError(
            f'"logprobs" is an integer from 0 to {MAX_TOP_LOGPROBS}: the most likely tokens '
            "to return beside each token's own log probability"
        )
    out["logprobs"] = logprobs
    out["logit_bias"] = _logit_bias(input.get("logit_bias"))
    return out


def _logit_bias(value: Any) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``{"token id": bias}`` as the engine takes it (the range is checked by
    ``Sampling``, the ids against the vocabulary by the engine)."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise LLMRequestError('"logit_bias" is an object of token id (a string) to bias')
    out = []
    for key, bias in value.items():
        token = key if _is_int(key) else None
        if isinstance(key, str) and key.isascii() and key.strip().isdigit():  # not "²"
            token = int(key)
        if token is None:
            raise LLMRequestError(f'"logit_bias" names {key!r}: a key is a token id, as "1234"')
        if isinstance(bias, bool) or not isinstance(bias, int | float):
            raise LLMRequestError(f'"logit_bias" of token {key} is a number from -100 to 100')
        out.append((token, float(bias)))
    return tuple(out)


#: The sampling values a call passes as numbers (None: the model's or OpenAI's default).
_NUMBERS = (
    "temperature",
    "top_p",
    "min_p",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
)
_INPUT_KEYS = {
    "messages",
    "prompt",
    "max_tokens",
    "top_k",
    "seed",
    "stop",
    "ignore_eos",
    "logprobs",
    "logit_bias",
    *_NUMBERS,
}


def _messages(messages: Any) -> list[dict[str, str]]:
    if not isinstance(messages, list) or not messages:
        raise LLMRequestError('"messages" is a non-empty list')
    out = []
    for m in messages:
        if not (
            isinstance(m, dict) and isinstance(m.get("role"), str) and "content" in m
        ) or not isinstance(m["content"], str):
            raise LLMRequestError('each message is {"role": str, "content": str}')
        out.append({"role": m["role"], "content": m["content"]})
    return out


def _number(input: dict[str, Any], name: str) -> float | None:
    value = input.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise LLMRequestError(f'"{name}" is a number')
    return float(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
