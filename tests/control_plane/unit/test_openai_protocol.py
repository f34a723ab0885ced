"""The OpenAI wire format: requests as SDK clients send them are read, and what
thaw does not implement is refused as OpenAI would, naming the parameter."""

from __future__ import annotations

import json
from typing import Any

import pytest

from control_plane.openai.calls import Stream, Target, call_input, response
from control_plane.openai.errors import OpenAIError, model_not_found
from control_plane.openai.protocol import (
    ChatCompletion,
    ChatCompletionRequest,
    ChatDelta,
    Completion,
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
        ({"logit_bias": {"fox": -100}}, "logit_bias", "a key is a token id"),
        ({"logit_bias": {"²": 1}}, "logit_bias", "a key is a token id"),
        ({"logit_bias": {"5": -101}}, "logit_bias.5", "greater than or equal to -100"),
        ({"top_logprobs": 3}, "top_logprobs", "top_logprobs needs logprobs: true"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "less than or equal to 20"),
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
        ({"logprobs": 21}, "logprobs"),
        ({"logprobs": 2, "top_logprobs": 2}, "top_logprobs"),  # chat's, not completions'
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


# --- logprobs ------------------------------------------------------------------------


def _entry(token: str, logprob: float, *top: tuple[str, float]) -> dict[str, Any]:
    def one(t: str, lp: float) -> dict[str, Any]:
        return {"token": t, "logprob": lp, "bytes": list(t.encode())}

    return {**one(token, logprob), "top_logprobs": [one(t, lp) for t, lp in top]}


def test_alternatives_of_the_same_text_keep_the_most_likely() -> None:
    from control_plane.openai.protocol import CompletionLogprobs

    cut = _entry("\ufffd", -1.0, ("\ufffd", -1.0), ("a", -1.5), ("\ufffd", -2.0))
    assert CompletionLogprobs.of([cut]).top_logprobs == [{"\ufffd": -1.0, "a": -1.5}]


ENTRIES = [
    _entry("He", -0.1, ("He", -0.1), ("A", -2.5)),
    _entry("llo", -0.7, ("llo", -0.7), ("y", -1.0)),
]


def _target() -> Target:
    from control_plane.protocol import LLMOptions
    from control_plane.spec import FunctionSpec

    spec = FunctionSpec.model_construct(name="tiny", llm=LLMOptions(), adapters=[])
    return Target("tiny", None, spec)


def _view(output: dict[str, Any]) -> Any:
    from control_plane.services.calls import CallView

    return CallView(
        id="c1", function="tiny", version=1, status="succeeded", attempt=1, input={},
        output=output, error=None, adapter=None, stream=False, cold=False, replica_id=None,
        phases_ms={}, timings_ms={}, accepted_at=1.0, deadline_at=2.0, finished_at=1.5,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "extra", "asked"),
    [
        (ChatCompletionRequest, {}, None),
        (ChatCompletionRequest, {"logprobs": False}, None),
        (ChatCompletionRequest, {"logprobs": True}, 0),
        (ChatCompletionRequest, {"logprobs": True, "top_logprobs": 5}, 5),
        (CompletionRequest, {}, None),
        (CompletionRequest, {"logprobs": 0}, 0),
        (CompletionRequest, {"logprobs": 20}, 20),
    ],
)
def test_logprobs_asked_reach_the_replica_as_a_count(
    kind: type[ChatCompletionRequest] | type[CompletionRequest],
    extra: dict[str, Any],
    asked: int | None,
) -> None:
    body = (
        {**CHAT, **extra}
        if kind is ChatCompletionRequest
        else {"model": "tiny", "prompt": "x", **extra}
    )
    made = call_input(parse_request(kind, body), _target())
    assert made.get("logprobs", "absent") == ("absent" if asked is None else asked)


def test_a_logit_bias_reaches_the_replica_as_sent() -> None:
    body = {**CHAT, "logit_bias": {"50256": -100, "7": 2.5}}
    made = call_input(parse_request(ChatCompletionRequest, body), _target())
    assert made["logit_bias"] == {"50256": -100.0, "7": 2.5}
    assert "logit_bias" not in call_input(parse_request(ChatCompletionRequest, CHAT), _target())


def test_a_chat_answer_has_its_tokens_logprobs_and_one_without_has_none() -> None:
    output = {"text": "Hello", "finish_reason": "length", "logprobs": ENTRIES, "usage": {}}
    asked = parse_request(ChatCompletionRequest, {**CHAT, "logprobs": True, "top_logprobs": 2})
    answer = response(asked, _view(output))
    assert isinstance(answer, ChatCompletion)
    sent = answer.model_dump(mode="json")["choices"][0]["logprobs"]
    assert sent == {"content": ENTRIES}
    plain = response(parse_request(ChatCompletionRequest, CHAT), _view(output))
    assert plain.model_dump(mode="json")["choices"][0]["logprobs"] is None


def test_a_text_completion_has_them_in_the_legacy_shape_with_offsets() -> None:
    output = {"text": "Hello", "finish_reason": "length", "logprobs": ENTRIES, "usage": {}}
    asked = parse_request(CompletionRequest, {"model": "tiny", "prompt": "x", "logprobs": 2})
    answer = response(asked, _view(output))
    assert isinstance(answer, Completion)
    assert answer.model_dump(mode="json")["choices"][0]["logprobs"] == {
        "tokens": ["He", "llo"],
        "token_logprobs": [-0.1, -0.7],
        "top_logprobs": [{"He": -0.1, "A": -2.5}, {"llo": -0.7, "y": -1.0}],
        "text_offset": [0, 2],
    }


@pytest.mark.parametrize("kind", [ChatCompletionRequest, CompletionRequest])
def test_a_stream_sends_each_chunks_logprobs_with_it(
    kind: type[ChatCompletionRequest] | type[CompletionRequest],
) -> None:
    if kind is ChatCompletionRequest:
        body: dict[str, Any] = {**CHAT, "stream": True, "logprobs": True, "top_logprobs": 2}
    else:
        body = {"model": "tiny", "prompt": "x", "stream": True, "logprobs": 2}
    stream = Stream(parse_request(kind, body), "c1")
    outputs = [
        {"text": "He", "tokens": 1, "prompt_tokens": 3, "logprobs": ENTRIES[:1]},
        {"text": "", "tokens": 1, "logprobs": ENTRIES[1:]},  # a stop string holds its text
        {"text": "llo", "tokens": 0, "finish_reason": "stop", "usage": {}},
    ]
    sent = [
        json.loads(e.decode().removeprefix("data: ")) for o in outputs for e in stream.output(o)
    ]
    choices = [c["choices"][0] for c in sent]
    with_logprobs = [c["logprobs"] for c in choices if c["logprobs"] is not None]
    if kind is ChatCompletionRequest:
        assert with_logprobs == [{"content": ENTRIES[:1]}, {"content": ENTRIES[1:]}]
        text = "".join(c["delta"].get("content", "") for c in choices)
    else:
        assert [lp["tokens"] for lp in with_logprobs] == [["He"], ["llo"]]
        assert [lp["text_offset"] for lp in with_logprobs] == [[0], [2]]
        text = "".join(c["text"] for c in choices)
    assert text == "Hello" and choices[-1]["finish_reason"] == "stop"
