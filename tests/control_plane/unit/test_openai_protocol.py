"""The OpenAI wire format: requests as SDK clients send them are read, and what
thaw does not implement is refused as OpenAI would, naming the parameter."""

from __future__ import annotations

import json
from typing import Any

import pytest

from control_plane.openai.calls import Stream
from control_plane.openai.errors import OpenAIError, model_not_found
from control_plane.openai.protocol import (
    ChatCompletionRequest,
    ChatDelta,
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


def test_vllm_extensions_load_generators_send() -> None:
    """guidellm's text request: ``ignore_eos``, ``stop: null``, usage on every chunk."""
    body = {
        "model": "m",
        "prompt": "x",
        "max_tokens": 32,
        "stop": None,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    req = parse_request(CompletionRequest, body)
    assert req.ignore_eos and req.continuous_usage() and req.stop_strings() == []
    alone = {**body, "stream_options": {"continuous_usage_stats": True}}
    assert not parse_request(CompletionRequest, alone).continuous_usage()  # needs include_usage
    assert not parse_request(CompletionRequest, {"model": "m", "prompt": "x"}).ignore_eos
    with pytest.raises(OpenAIError) as caught:
        parse_request(CompletionRequest, {**body, "ignore_eos": "sometimes"})
    assert caught.value.param == "ignore_eos"


def test_a_stream_with_continuous_usage_counts_tokens_as_they_come() -> None:
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    outputs = [
        {"text": "He", "tokens": 2, "prompt_tokens": 5},
        {"text": "llo", "tokens": 1},
        {
            "text": "",
            "tokens": 1,
            "finish_reason": "length",
            "usage": {"prompt_tokens": 5, "completion_tokens": 4},
        },
    ]

    def events(options: dict[str, Any]) -> list[dict[str, Any]]:
        request = parse_request(ChatCompletionRequest, {**body, "stream_options": options})
        stream = Stream(request, "c1")
        sent = [e for out in outputs for e in stream.output(out)]
        return [json.loads(e.decode().removeprefix("data: ")) for e in sent]

    continuous = events({"include_usage": True, "continuous_usage_stats": True})
    usage = [(c["usage"]["prompt_tokens"], c["usage"]["completion_tokens"]) for c in continuous]
    # role, "He", "llo", the finish, the usage chunk
    assert usage == [(5, 2), (5, 2), (5, 3), (5, 4), (5, 4)]
    assert continuous[-1]["choices"] == [] and continuous[-1]["usage"]["total_tokens"] == 9
    plain = events({"include_usage": True})
    assert [c["usage"] for c in plain[:-1]] == [None] * 4 and plain[-1]["usage"] is not None


TEXTS = ["He", ' "quoted" \\ back', "é ü 漢字 🙂", "tab\tnew\nline\x01\x7f", "\u2028</script>"]


@pytest.mark.parametrize("kind", [ChatCompletionRequest, CompletionRequest])
@pytest.mark.parametrize("model", ["tiny", 'odd "model" é'])
def test_a_text_chunk_is_the_same_bytes_as_the_chunk_model_makes(
    kind: type[ChatCompletionRequest] | type[CompletionRequest], model: str
) -> None:
    # Most chunks are made from the stream's first, split around its text: byte for
    # byte what the chunk's model gives, whatever the text and the model's name.
    body = {**CHAT, "model": model, "stream": True}
    if kind is CompletionRequest:
        body = {"model": model, "prompt": "Hi", "stream": True}
    stream = Stream(parse_request(kind, body), "c1")
    stream.output({"text": "", "tokens": 0, "prompt_tokens": 5})  # the role's chunk
    for text in TEXTS:
        (fast,) = stream.output({"text": text, "tokens": 1})
        if kind is ChatCompletionRequest:
            slow = stream._chat(ChatDelta(content=text))
        else:
            slow = stream._text(text)
        assert fast == slow
        sent = json.loads(fast.decode().removeprefix("data: "))
        assert sent["model"] == model
        assert sent["id"] == ("chatcmpl-c1" if stream.chat else "cmpl-c1")
        choice = sent["choices"][0]
        assert (choice["delta"]["content"] if stream.chat else choice["text"]) == text


@pytest.mark.parametrize(
    ("extra", "param", "says"),
    [
        ({"n": 2}, "n", "n > 1 is not supported"),
        ({"max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
        ({"max_completion_tokens": -1}, "max_completion_tokens", "greater than or equal to 1"),
        ({"temperature": 3}, "temperature", "less than or equal to 2"),
        ({"top_p": 0}, "top_p", "greater than 0"),
        ({"top_k": -2}, "top_k", "greater than or equal to -1"),
        ({"tools": [{"type": "function"}]}, "tools", "unsupported parameter: tools"),
        ({"logprobs": True}, "logprobs", "logprobs is not supported"),
        ({"presence_penalty": 2.5}, "presence_penalty", "less than or equal to 2"),
        ({"frequency_penalty": -3}, "frequency_penalty", "greater than or equal to -2"),
        ({"repetition_penalty": 0}, "repetition_penalty", "greater than 0"),
        ({"min_p": 1.5}, "min_p", "less than or equal to 1"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4"),
        ({"stop": "x" * 1025}, "stop", "at most 1024 characters"),
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
        ({"prompt": []}, "prompt"),  # was an IndexError making the call's input: a 500
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
