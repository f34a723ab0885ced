"""``thaw loadtest`` on an LLM function: every call one streamed OpenAI request.

A function (or ``function:adapter``) that ``GET /openai/v1/models`` lists is driven
through ``POST /openai/v1/chat/completions`` (or ``completions``) with
``stream=True`` and ``stream_options.include_usage``, the way the ``openai`` SDK
and guidellm send it. Timed on the client, from when the call was due:

    TTFT    to the first chunk with text
    TPOT    the mean gap per output token after it: (end - first) / (tokens - 1)
    tokens  the usage chunk's prompt and completion tokens

Prompts rotate through a set of varied lengths (``--prompt``/``--prompts`` replace
it); call ``i`` samples with seed ``i``, so a run repeats. A stream that began
while its call was queued has no ``X-Thaw-Cold``; :func:`resolve_cold` asks the
call record afterwards, by ``X-Thaw-Call-Id``.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import httpx

PROMPTS = (
    "Hello",
    "The quick brown fox jumps over the lazy dog",
    "A cold start is the first request after idle, and",
    "Where did every millisecond of the first request go? Tell me in order:",
    "Weights are stored as verified, content-addressed chunks, streamed in the "
    "order a replica first touched them, straight into tensors on the device, so",
)
MAX_COLD_LOOKUPS = 1000  # call records read to learn cold or warm, at most

Endpoint = Literal["chat", "completions"]


class LlmLoadError(ValueError):
    """The LLM options are wrong; the message says how."""


@dataclass(frozen=True)
class LlmLoad:
    model: str  # a function, or function:adapter
    prompts: tuple[str, ...] = PROMPTS
    max_tokens: int = 64
    endpoint: Endpoint = "chat"
    temperature: float = 1.0
    ignore_eos: bool = False  # every call makes max_tokens tokens (vLLM's extension)

    def body(self, i: int) -> dict[str, Any]:
        prompt = self.prompts[i % len(self.prompts)]
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "seed": i,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.ignore_eos:
            body["ignore_eos"] = True
        if self.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        return body

    @property
    def path(self) -> str:
        return f"/openai/v1/{'chat/completions' if self.endpoint == 'chat' else 'completions'}"


@dataclass(frozen=True)
class LlmResult:
    """What one stream showed the client; times in seconds from when it was due."""

    status: int
    ttft_s: float | None = None
    end_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cold: bool | None = None
    call_id: str | None = None
    error: str | None = None

    @property
    def tpot_s(self) -> float | None:
        n = self.completion_tokens
        if self.ttft_s is None or self.end_s is None or n is None or n < 2:
            return None
        return (self.end_s - self.ttft_s) / (n - 1)


def load_prompts(path: Path) -> tuple[str, ...]:
    """Prompts from a file: JSON lines with ``prompt`` (a string), or one per line."""
    try:
        lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    except OSError as exc:
        raise LlmLoadError(f"--prompts {path}: {exc.strerror or exc}") from None
    if not lines:
        raise LlmLoadError(f"--prompts {path}: the file has no prompts")
    if not lines[0].lstrip().startswith("{"):
        return tuple(lines)
    prompts = []
    for n, line in enumerate(lines, 1):
        try:
            prompt = json.loads(line).get("prompt")
        except (ValueError, AttributeError):
            prompt = None
        if not isinstance(prompt, str) or not prompt:
            raise LlmLoadError(
                f'--prompts {path}, line {n}: expected a JSON object with "prompt" (a string)'
            )
        prompts.append(prompt)
    return tuple(prompts)


def served_models(c: httpx.Client) -> list[str] | None:
    """The ids ``/openai/v1/models`` lists, or None when the server has no such route."""
    r = c.get("/openai/v1/models")
    if r.status_code != 200:
        return None
    return [m["id"] for m in r.json().get("data", [])]


class CallIndex:
    """Call numbers across client threads: prompt ``i % len``, seed ``i``."""

    def __init__(self) -> None:
        self._next = 0
        self._lock = threading.Lock()

    def take(self) -> int:
        with self._lock:
            i, self._next = self._next, self._next + 1
            return i


def stream_call(c: httpx.Client, load: LlmLoad, i: int, now_s: Any) -> LlmResult:
    """One streamed request; ``now_s()`` is seconds since the call was due."""
    first: float | None = None
    usage: dict[str, Any] = {}
    with c.stream("POST", load.path, json=load.body(i)) as r:
        cold = r.headers.get("X-Thaw-Cold")
        result = LlmResult(
            r.status_code,
            cold=None if cold is None else cold == "true",
            call_id=r.headers.get("X-Thaw-Call-Id"),
        )
        if r.status_code != 200:
            r.read()
            return replace(result, error=f"{r.status_code} {_message(r.text)}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            if "error" in chunk:
                return replace(result, error=f"stream: {_message(json.dumps(chunk))}")
            if first is None and _has_text(chunk):
                first = now_s()
            usage = chunk.get("usage") or usage
    end = now_s()
    if not usage:
        return replace(result, end_s=end, error="the stream ended with no usage chunk")
    return replace(
        result,
        ttft_s=first,
        end_s=end,
        prompt_tokens=usage.get("prompt_tokens"),
        completion_tokens=usage.get("completion_tokens"),
    )


def _has_text(chunk: dict[str, Any]) -> bool:
    for choice in chunk.get("choices") or ():
        if choice.get("text") or (choice.get("delta") or {}).get("content"):
            return True
    return False


def _message(text: str) -> str:
    """OpenAI's ``error.message`` when ``text`` is its error object, else the text."""
    try:
        return str(json.loads(text)["error"]["message"])[:200]
    except (ValueError, KeyError, TypeError):
        return text[:200]


def resolve_cold(c: httpx.Client, call_ids: list[str]) -> dict[str, bool]:
    """Cold or warm of calls whose stream began queued, from their records."""
    out: dict[str, bool] = {}
    for call_id in call_ids[:MAX_COLD_LOOKUPS]:
        try:
            r = c.get(f"/v1/calls/{call_id}")
        except httpx.HTTPError:
            continue
        cold = r.json().get("cold") if r.status_code == 200 else None
        if isinstance(cold, bool):
            out[call_id] = cold
    return out
