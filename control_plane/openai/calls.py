"""An OpenAI request as a thaw call, and the call's end as OpenAI's answer.

``model`` names an LLM function (``function`` or ``function:adapter``) the key may
invoke; the adapter is one the function lists, or one pushed to the store
(``function:NAME:TAG``), which the replica loads on first use. The call's input is
what ``worker.llm.function`` takes; what it yields (text deltas, the last with its
finish reason and usage) becomes the response, or the chunks of a stream
(``ChatStream``, ``CompletionStream``).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, NamedTuple

import pydantic_core
from sqlalchemy import select
from sqlalchemy.orm import Session

from control_plane.db.models import Function
from control_plane.errors import BadRequestError, ForbiddenError
from control_plane.openai.errors import OpenAIError, invalid, model_not_found
from control_plane.openai.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    ChatLogprobs,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    FinishReason,
    ModelCard,
    ModelList,
    Usage,
)
from control_plane.services import catalog, functions
from control_plane.services.calls import CallView
from control_plane.services.functions import ActiveVersion
from control_plane.services.keys import Principal
from control_plane.spec import FunctionSpec
from snapshotter.registry import Registry

#: Errors the LLM function raises for a request it cannot serve: 400, not 500.
REQUEST_ERRORS = ("LLMRequestError", "PromptTooLongError")


@dataclass(frozen=True)
class Target:
    function: str
    adapter: str | None
    spec: FunctionSpec


class _Model(NamedTuple):
    """An LLM function this key may call, as ``GET /models`` lists it."""

    target: Target
    created: int


def _llm_functions(
    session: Session, who: Principal, versions: functions.VersionCache
) -> list[_Model]:
    """Every LLM function this key may invoke, as deployed now."""
    fns = session.scalars(select(Function).order_by(Function.name))
    return [m for m in (_llm_model(session, who, fn, versions) for fn in fns) if m is not None]


def _llm_model(
    session: Session, who: Principal, fn: Function, versions: functions.VersionCache
) -> _Model | None:
    """``fn`` as an LLM function this key may invoke, or None. Its spec comes from
    ``versions`` (a deployed version never changes): no parse per request."""
    if fn.active_version is None:
        return None
    try:
        who.require("invoke", fn.name)
    except ForbiddenError:
        return None
    key = functions.FunctionKey(fn.id, fn.created_at, fn.name)
    spec = versions.version_of(session, key, fn.active_version).spec
    return _Model(Target(fn.name, None, spec), int(fn.created_at)) if spec.llm else None


def model_list(session: Session, who: Principal, versions: functions.VersionCache) -> ModelList:
    """One card per LLM function and one per ``function:adapter``."""
    cards = []
    for target, created in _llm_functions(session, who, versions):
        cards.append(ModelCard(id=target.function, created=created))
        for adapter in target.spec.adapters:
            cards.append(ModelCard(id=f"{target.function}:{adapter.name}", created=created))
    return ModelList(data=cards)


class UnknownModel(Exception):
    """``model`` names no LLM function (or adapter) this key may call: OpenAI's 404,
    once its message lists what the key may call (``not_found``)."""


def target_of(model: str, fn: ActiveVersion, registry: Registry | None = None) -> Target:
    """``model`` (``function`` or ``function:adapter``) on ``fn``, the version a call of
    the function is accepted on. Raises ``UnknownModel``: not an LLM function, or an
    adapter it neither lists nor could load from ``registry`` (the store)."""
    _, _, adapter = model.partition(":")
    if fn.spec.llm is None:
        raise UnknownModel(model)
    if adapter and adapter not in {a.name for a in fn.spec.adapters}:
        if registry is None or fn.loads_adapters is False:
            raise UnknownModel(model)
        try:
            catalog.resolve_adapter(registry, adapter)
        except BadRequestError:
            raise UnknownModel(model) from None
    return Target(fn.name, adapter or None, fn.spec)


def not_found(
    session: Session, who: Principal, model: str, versions: functions.VersionCache
) -> OpenAIError:
    """OpenAI's 404 for ``model``, listing the models this key may call."""
    return model_not_found(model, [card.id for card in model_list(session, who, versions).data])


def call_input(
    request: ChatCompletionRequest | CompletionRequest, target: Target
) -> dict[str, Any]:
    """What ``worker.llm.function`` takes. Raises OpenAI's 400 for ``max_tokens``
    over the function's limit (the replica checks the context)."""
    assert target.spec.llm is not None
    requested = request.requested_tokens()
    limit = target.spec.llm.max_tokens_limit
    if requested is not None and requested > limit:
        param = "max_completion_tokens" if _asks_completion_tokens(request) else "max_tokens"
        raise invalid(
            f"{param} is {requested}; {target.function} allows at most {limit} per call", param
        )
    out: dict[str, Any] = {
        "max_tokens": requested,
        # Left out: the model's generation_config.json decides, in the replica.
        "temperature": request.temperature,
        "top_p": request.top_p,
        "top_k": request.top_k,
        "min_p": request.min_p,
        "repetition_penalty": request.repetition_penalty,
        "frequency_penalty": request.frequency_penalty,
        "presence_penalty": request.presence_penalty,
        "seed": request.seed,
        "stop": request.stop_strings(),
    }
    if request.ignore_eos:
        out["ignore_eos"] = True
    if request.top_asked() is not None:
        out["logprobs"] = request.top_asked()
    if request.logit_bias:
        out["logit_bias"] = dict(request.logit_bias)
    if isinstance(request, ChatCompletionRequest):
        out["messages"] = [{"role": m.role, "content": m.text()} for m in request.messages]
    else:
        prompt = request.prompt
        out["prompt"] = (
            prompt[0] if isinstance(prompt, list) and isinstance(prompt[0], str) else prompt
        )
    return out


def _asks_completion_tokens(request: ChatCompletionRequest | CompletionRequest) -> bool:
    return isinstance(request, ChatCompletionRequest) and request.max_completion_tokens is not None


def failure(view: CallView | None, error: str | None, status: str) -> OpenAIError:
    """The OpenAI error for a call that did not succeed."""
    text = error or f"the call ended {status}"
    kind, _, rest = text.partition(": ")
    if kind in REQUEST_ERRORS:
        message = rest.splitlines()[0] if rest else text
        param = "messages" if view is not None and "messages" in (view.input or {}) else "prompt"
        return OpenAIError(400, message, param if kind == "PromptTooLongError" else None)
    if status in ("timeout", "expired"):
        return OpenAIError(504, text.splitlines()[0], None, "timeout")
    if status == "cancelled":
        return OpenAIError(409, text.splitlines()[0])
    call = f" (call {view.id})" if view is not None else ""
    return OpenAIError(500, f"the model failed{call}: {text.splitlines()[0]}")


def _usage(output: dict[str, Any]) -> Usage:
    usage = output.get("usage") or {}
    return Usage.of(int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0)))


def response(
    request: ChatCompletionRequest | CompletionRequest, view: CallView
) -> ChatCompletion | Completion:
    """A succeeded call as the completion object."""
    output = view.output if isinstance(view.output, dict) else {}
    text = str(output.get("text", ""))
    reason: FinishReason = "length" if output.get("finish_reason") == "length" else "stop"
    created = int(view.accepted_at)
    entries = output.get("logprobs") if request.top_asked() is not None else None
    if isinstance(request, ChatCompletionRequest):
        message = AssistantMessage(content=text)
        logprobs = None if entries is None else ChatLogprobs.model_validate({"content": entries})
        choice = ChatChoice(message=message, finish_reason=reason, logprobs=logprobs)
        return ChatCompletion(
            id=f"chatcmpl-{view.id}",
            created=created,
            model=request.model,
            choices=[choice],
            usage=_usage(output),
        )
    return Completion(
        id=f"cmpl-{view.id}",
        created=created,
        model=request.model,
        choices=[
            CompletionChoice(
                text=text,
                finish_reason=reason,
                logprobs=None if entries is None else CompletionLogprobs.of(entries),
            )
        ],
        usage=_usage(output),
    )


def sse(data: Any) -> bytes:
    body = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {body}\n\n".encode()


DONE = b"data: [DONE]\n\n"


class Stream:
    """One stream's chunks, as the call's outputs come (``chunks``), in OpenAI's
    shape for chat (``chat.completion.chunk``) or text (``text_completion``). With
    ``continuous_usage_stats`` every chunk carries the usage so far, as vLLM sends it."""

    def __init__(
        self, request: ChatCompletionRequest | CompletionRequest, call_id: str | None = None
    ) -> None:
        self.request = request
        self.chat = isinstance(request, ChatCompletionRequest)
        prefix = "chatcmpl-" if self.chat else "cmpl-"
        self.id = prefix + (call_id or uuid.uuid4().hex)
        self.created = int(time.time())
        self.started = False
        self.continuous = request.continuous_usage()
        self.prompt_tokens = self.completion_tokens = 0
        self._text_chunk: tuple[bytes, bytes] | None = None  # see ``_text_only``
        self.logprobs = request.top_asked() is not None
        self._text_offset = 0  # a text completion's logprobs: where the next token starts

    def output(self, chunk: Any) -> list[bytes]:
        """The SSE events for one output of the call."""
        chunk = chunk if isinstance(chunk, dict) else {}
        self.prompt_tokens = int(chunk.get("prompt_tokens", self.prompt_tokens))
        self.completion_tokens += int(chunk.get("tokens", 0))
        events = []
        if self.chat and not self.started:
            events.append(self._chat(ChatDelta(role="assistant", content="")))
        self.started = True
        text, reason = str(chunk.get("text", "")), chunk.get("finish_reason")
        entries = chunk.get("logprobs") if self.logprobs else None
        if entries:  # the text may lag its tokens (a cut character, a stop string)
            events.append(self._with_logprobs(text, entries))
        elif text and reason is None and not self.continuous:
            events.append(self._text_only(text))
        elif text:
            events.append(self._chat(ChatDelta(content=text)) if self.chat else self._text(text))
        if reason is not None:
            usage = _usage(chunk)
            self.prompt_tokens, self.completion_tokens = (
                usage.prompt_tokens,
                usage.completion_tokens,
            )
            last = self._chat(ChatDelta(), reason) if self.chat else self._text("", reason)
            events.append(last)
            if self.request.include_usage():
                events.append(self._usage(usage))
        return events

    def _with_logprobs(self, text: str, entries: list[dict[str, Any]]) -> bytes:
        if self.chat:
            logprobs = ChatLogprobs.model_validate({"content": entries})
            return self._chat(ChatDelta(content=text), logprobs=logprobs)
        made = CompletionLogprobs.of(entries, self._text_offset)
        self._text_offset += sum(len(e["token"]) for e in entries)
        return self._text(text, logprobs=made)

    def _text_only(self, text: str) -> bytes:
        """A chunk of text and nothing else (most of a stream's), the same bytes as
        ``_chat`` or ``_text`` make, from the stream's first such chunk split around its
        text (a mark no id or model name holds): each later one costs an encoding of its
        text, not a model's (1.4 µs against 26: the server encodes every token of every
        stream)."""
        if self._text_chunk is None:
            mark = f"thaw-text-{uuid.uuid4().hex}"
            whole = self._chat(ChatDelta(content=mark)) if self.chat else self._text(mark)
            before, _, after = whole.partition(self._encoded(mark))
            self._text_chunk = (before, after)
        before, after = self._text_chunk
        return before + self._encoded(text) + after

    def _encoded(self, text: str) -> bytes:
        """``text`` as a JSON string, as ``_chat`` (``json``) or ``_text`` (pydantic) do."""
        return json.dumps(text).encode() if self.chat else pydantic_core.to_json(text)

    def _so_far(self) -> Usage | None:
        """The usage so far, for a chunk with choices (None: not asked for)."""
        return Usage.of(self.prompt_tokens, self.completion_tokens) if self.continuous else None

    def _chat(
        self, delta: ChatDelta, reason: Any = None, logprobs: ChatLogprobs | None = None
    ) -> bytes:
        choice = ChatChunkChoice(delta=delta, finish_reason=reason, logprobs=logprobs)
        chunk = ChatCompletionChunk(
            id=self.id,
            created=self.created,
            model=self.request.model,
            choices=[choice],
            usage=self._so_far(),
        )
        body = chunk.model_dump(mode="json")
        body["choices"][0]["delta"] = delta.model_dump(exclude_none=True)  # as OpenAI sends it
        return sse(body)

    def _text(
        self, text: str, reason: Any = None, logprobs: CompletionLogprobs | None = None
    ) -> bytes:
        choice = CompletionChoice(text=text, finish_reason=reason, logprobs=logprobs)
        chunk = Completion(
            id=self.id,
            created=self.created,
            model=self.request.model,
            choices=[choice],
            usage=self._so_far(),
        )
        return sse(chunk.model_dump_json())

    def _usage(self, usage: Usage) -> bytes:
        """The last chunk with ``stream_options.include_usage``: no choices, the usage."""
        if self.chat:
            chunk: ChatCompletionChunk | Completion = ChatCompletionChunk(
                id=self.id, created=self.created, model=self.request.model, choices=[], usage=usage
            )
        else:
            chunk = Completion(
                id=self.id, created=self.created, model=self.request.model, choices=[], usage=usage
            )
        return sse(chunk.model_dump_json())

    @staticmethod
    def error(error: OpenAIError) -> bytes:
        """An error after the stream began (the status was sent): as OpenAI streams it,
        which the SDK raises as ``APIError``."""
        return sse(error.body())
