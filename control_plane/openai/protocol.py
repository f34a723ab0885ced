"""The OpenAI wire format thaw serves, in one place: requests as clients send them
(the ``openai`` SDK, LangChain, load generators), responses and stream chunks as
they expect them. A parameter thaw does not implement is refused, naming it
(``unsupported``), never ignored: a client that asks for tools must learn it got
none.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from control_plane.openai.errors import OpenAIError, invalid
from control_plane.protocol import MAX_STOP_CHARS, MAX_STOP_SEQUENCES

#: Alternatives a request may ask for at each token (OpenAI's limit for chat; vLLM
#: takes as many on completions, where OpenAI stops at 5).
MAX_TOP_LOGPROBS = 20

FinishReason = Literal["stop", "length"]


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        """The content as one string (text parts joined, as the chat template wants)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False
    # vLLM's extension, which load generators (guidellm) send: with include_usage,
    # every chunk carries the usage so far
    continuous_usage_stats: bool = False


class _Generation(BaseModel):
    """What chat and text completions share. Fields OpenAI defines but thaw does not
    implement are accepted at their neutral value only (``unsupported``)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    # vLLM's extension: sample from the k most likely tokens (0 or -1: all of them)
    top_k: int | None = Field(default=None, ge=-1)
    n: int = Field(default=1, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=0, lt=2**63)
    user: str | None = None  # an end-user id for the caller's own records: kept out of it
    # OpenAI's range; applied to the output's tokens (worker.llm.penalties)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2, allow_inf_nan=False)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2, allow_inf_nan=False)
    # vLLM's extensions (None: the model's generation_config.json, else off)
    repetition_penalty: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    min_p: float | None = Field(default=None, ge=0, le=1)
    # token id (as a string) -> bias added to its logit, before the penalties
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100, allow_inf_nan=False)]] | None = (
        None
    )
    # vLLM's extension: generate max_tokens whatever the model's end of text (how load
    # generators fix a request's output length)
    ignore_eos: bool = False

    def stop_strings(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return [s for s in stops if s]

    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def continuous_usage(self) -> bool:
        """Usage on every chunk (vLLM's ``continuous_usage_stats``, with include_usage)."""
        options = self.stream_options
        return options is not None and options.include_usage and options.continuous_usage_stats

    def unsupported(self) -> OpenAIError | None:
        """The first parameter set to something thaw does not do, as the 400 to send."""
        if self.n != 1:
            return invalid("n > 1 is not supported: send n separate requests", "n")
        if len(self.stop_strings()) > MAX_STOP_SEQUENCES:
            return invalid(f"stop takes at most {MAX_STOP_SEQUENCES} sequences", "stop")
        if any(len(s) > MAX_STOP_CHARS for s in self.stop_strings()):
            return invalid(f"each stop sequence is at most {MAX_STOP_CHARS} characters", "stop")
        if self.stream_options is not None and not self.stream:
            return invalid("stream_options is only allowed with stream: true", "stream_options")
        for key in self.logit_bias or {}:
            if not (key.isascii() and key.isdigit()):  # "²" is a digit, not an int
                return invalid(
                    f'logit_bias names {key!r}: a key is a token id, as "1234"', "logit_bias"
                )
        return None


class ChatCompletionRequest(_Generation):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    # each output token's log probability, and with top_logprobs the n most likely
    # tokens' at its position (the model's own, before any sampling value)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)

    def requested_tokens(self) -> int | None:
        """``max_completion_tokens`` (the current name), else ``max_tokens``."""
        return self.max_completion_tokens or self.max_tokens

    def top_asked(self) -> int | None:
        """The alternatives asked for at each token (None: no logprobs)."""
        return (self.top_logprobs or 0) if self.logprobs else None

    def unsupported(self) -> OpenAIError | None:
        if self.top_logprobs is not None and not self.logprobs:
            return invalid("top_logprobs needs logprobs: true", "top_logprobs")
        return super().unsupported()


class CompletionRequest(_Generation):
    prompt: str | list[str] | list[int]
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None
    # each output token's log probability and the n most likely tokens' at its position
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)

    def requested_tokens(self) -> int:
        return self.max_tokens or 16  # OpenAI's default for completions

    def top_asked(self) -> int | None:
        return self.logprobs

    def unsupported(self) -> OpenAIError | None:
        if isinstance(self.prompt, list) and not self.prompt:
            return invalid("prompt is empty: send a string or a list of token ids", "prompt")
        several = isinstance(self.prompt, list) and len(self.prompt) > 1
        if several and isinstance(self.prompt[0], str):
            return invalid("a list of several prompts is not supported", "prompt")
        for name in ("echo", "suffix"):
            if getattr(self, name):
                return invalid(f"{name} is not supported (leave it out)", name)
        if self.best_of not in (None, 1):
            return invalid("best_of is not supported (leave it out)", "best_of")
        return super().unsupported()


R = TypeVar("R", bound=_Generation)


def parse_request(cls: type[R], body: Any) -> R:
    """``body`` as ``cls``, or the 400 OpenAI would give, naming the first bad field."""
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    try:
        request = cls.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        if first["type"] == "extra_forbidden":
            raise invalid(f"unsupported parameter: {param}", param) from None
        raise invalid(f"{param}: {first['msg']}", param) from None
    refused = request.unsupported()
    if refused is not None:
        raise refused
    return request


# --- responses ------------------------------------------------------------------------
class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int) -> Usage:
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
        )


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprobEntry(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    """A chat choice's (or chunk's) ``logprobs``: one entry per token."""

    content: list[TokenLogprobEntry] | None


class CompletionLogprobs(BaseModel):
    """A text completion's ``logprobs``, the legacy shape: lists side by side, the
    alternatives as token -> logprob, and each token's offset in the text."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]

    @classmethod
    def of(cls, entries: list[dict[str, Any]], offset: int = 0) -> CompletionLogprobs:
        """Chat-shaped ``entries`` (the replica's), the first at ``offset`` of the text."""
        offsets = []
        for entry in entries:
            offsets.append(offset)
            offset += len(entry["token"])
        return cls(
            tokens=[e["token"] for e in entries],
            token_logprobs=[e["logprob"] for e in entries],
            top_logprobs=[_by_text(e["top_logprobs"]) for e in entries],
            text_offset=offsets,
        )


def _by_text(top: list[dict[str, Any]]) -> dict[str, float]:
    """Alternatives as text -> logprob, most likely first; tokens of the same text (a
    cut character's U+FFFD) keep the most likely one's."""
    out: dict[str, float] = {}
    for alternative in top:
        out.setdefault(alternative["token"], alternative["logprob"])
    return out


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: FinishReason
    logprobs: ChatLogprobs | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    finish_reason: FinishReason | None = None
    logprobs: ChatLogprobs | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: FinishReason | None = None
    logprobs: CompletionLogprobs | None = None


class Completion(BaseModel):
    """A text completion, and (with ``usage`` None until the last) each stream chunk."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str  # "function" or "function:adapter"
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "thaw"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
