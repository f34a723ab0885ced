"""The OpenAI wire format: requests as SDK clients send them are read, and what
thaw does not implement is refused as OpenAI would, naming the parameter."""

from __future__ import annotations

from typing import Any

import pytest

from control_plane.openai.errors import OpenAIError, model_not_found
from control_plane.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    Usage,
    parse_request,
)

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}]}


def test_content_as_a_string_or_as_text_parts() -> None:
    parts = [{"type": "text", "text": "Hello, "}, {"type": "text", "text": "world"}]
    body = {
        **CHAT,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": parts},
        ],
    }
    req = parse_request(ChatCompletionRequest, body)
    assert [m.text() for m in req.messages] == ["Be brief.", "Hello, world"]


def test_token_limits_and_stream_options() -> None:
    req = parse_request(
        ChatCompletionRequest, {**CHAT, "max_completion_tokens": 7, "max_tokens": 3}
    )
    assert req.requested_tokens() == 7
    assert parse_request(ChatCompletionRequest, {**CHAT, "max_tokens": 3}).requested_tokens() == 3
    assert parse_request(ChatCompletionRequest, CHAT).requested_tokens() is None
    assert parse_request(CompletionRequest, {"model": "m", "prompt": "x"}).requested_tokens() == 16
    streamed = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    assert parse_request(ChatCompletionRequest, streamed).include_usage()
    req = parse_request(ChatCompletionRequest, {**CHAT, "stop": "\n", "seed": 3, "temperature": 0})
    assert (req.stop_strings(), req.seed, req.temperature) == (["\n"], 3, 0)


@pytest.mark.parametrize(
    ("extra", "param", "says"),
    [
        ({"n": 2}, "n", "n > 1 is not supported"),
        ({"max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
        ({"max_completion_tokens": -1}, "max_completion_tokens", "greater than or equal to 1"),
        ({"temperature": 3}, "temperature", "less than or equal to 2"),
        ({"top_p": 0}, "top_p", "greater than 0"),
        ({"tools": [{"type": "function"}]}, "tools", "unsupported parameter: tools"),
        ({"logprobs": True}, "logprobs", "logprobs is not supported"),
        ({"presence_penalty": 0.5}, "presence_penalty", "presence_penalty is not supported"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4"),
        ({"stream_options": {"include_usage": True}}, "stream_options", "stream: true"),
        ({"messages": []}, "messages", "at least 1"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages.0.role", "Input should be"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages.0.content",
            "messages.0.content",
        ),
    ],
)
def test_what_is_not_supported_is_named(extra: dict[str, Any], param: str, says: str) -> None:
    with pytest.raises(OpenAIError) as caught:
        parse_request(ChatCompletionRequest, {**CHAT, **extra})
    err = caught.value
    assert err.status == 400 and err.param is not None and err.param.startswith(param)
    assert says in err.message
    body = err.body()["error"]
    assert body["type"] == "invalid_request_error" and body["param"] == err.param


def test_completion_refusals_and_neutral_values() -> None:
    for extra, param in (
        ({"echo": True}, "echo"),
        ({"best_of": 2}, "best_of"),
        ({"prompt": ["a", "b"]}, "prompt"),
    ):
        with pytest.raises(OpenAIError) as caught:
            parse_request(CompletionRequest, {"model": "m", "prompt": "x", **extra})
        assert caught.value.param == param
    # Neutral values, as some clients always send them, are fine.
    neutral = {"presence_penalty": 0, "frequency_penalty": 0, "logprobs": None, "n": 1}
    assert parse_request(CompletionRequest, {"model": "m", "prompt": [1, 2, 3], **neutral})
    with pytest.raises(OpenAIError, match="JSON object"):
        parse_request(CompletionRequest, ["not", "an", "object"])


def test_errors_and_usage_in_openai_shape() -> None:
    err = model_not_found("nope", ["tiny", "tiny:pirate"])
    assert err.status == 404
    assert err.body() == {
        "error": {
            "message": err.message,
            "type": "not_found_error",
            "param": "model",
            "code": "model_not_found",
        }
    }
    assert "tiny:pirate" in err.message
    assert Usage.of(5, 7).total_tokens == 12
