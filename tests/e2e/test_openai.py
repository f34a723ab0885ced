"""An LLM function (``[llm]``, no code) on the embedded stack, driven by the ``openai``
SDK unchanged at ``/openai/v1``: the first call from zero, listing, chat and text
completions, streams with usage, logprobs, an adapter by ``function:adapter``, bad input as
OpenAI's errors, a client that leaves mid-stream, and eight streams sharing steps.

The model is the example's tiny Llama (random weights) with its byte-level tokenizer
and chat template, built here; greedy text is checked against ``generate``."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch

from control_plane.db.session import Database
from control_plane.services import calls
from examples.build_model import build_adapter, build_model
from snapshotter.push import push_directory
from snapshotter.registry import Registry
from snapshotter.stores import LocalStore
from tests.e2e.conftest import E2EStore, running_stack
from tests.e2e.llm_stack import (
    FUNCTION,
    MAX_NUM_SEQS,
    check_loadtest,
    llm_metrics,
    llm_spec,
    loadtest_cli,
    push_llm,
    run_loadtest,
)
from tests.e2e.stack import Stack


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model(tmp_path_factory.mktemp("llm") / "model")


@pytest.fixture(scope="module")
def stack_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("openai-e2e")


@pytest.fixture(scope="module")
def stack(stack_dir: Path, model_dir: Path) -> Iterator[Stack]:
    tmp = stack_dir
    bundle = push_llm(LocalStore(tmp / "store"), model_dir, tmp)
    store = E2EStore(root=tmp / "store", bundle=bundle, model="tiny-chat:v1")
    with running_stack("embedded", tmp, store) as s:
        s.deploy(llm_spec(bundle))
        yield s


def sdk(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.url}/openai/v1", api_key=stack.admin_key, max_retries=0)


def generate_text(model_dir: Path, ids: list[int], max_new_tokens: int, **options: Any) -> str:
    """What ``generate`` says greedily for ``ids``, decoded."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]), do_sample=False, max_new_tokens=max_new_tokens, **options
        )
    return str(tokenizer.decode(out[0, len(ids) :], skip_special_tokens=True))


def prompt_ids(model_dir: Path, text: str) -> list[int]:
    from transformers import AutoTokenizer

    return list(AutoTokenizer.from_pretrained(model_dir)(text)["input_ids"])


def chat_ids(model_dir: Path, content: str) -> list[int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    encoded: Any = tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=True
    )
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


def test_the_first_call_waits_through_the_cold_start_then_streams(
    stack: Stack, model_dir: Path
) -> None:
    """Scaled to zero: the stream sends comments while the replica starts, then chunks."""
    body = {
        "model": FUNCTION,
        "prompt": "The quick brown fox",
        "max_tokens": 12,
        "temperature": 0,
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {stack.admin_key}"}
    lines = []
    with (
        httpx.Client(base_url=stack.url, timeout=120) as c,
        c.stream("POST", "/openai/v1/completions", json=body, headers=headers) as r,
    ):
        assert r.status_code == 200, r.read()
        assert "x-thaw-cold" not in r.headers  # still queued when the stream began
        call_id = r.headers["x-thaw-call-id"]
        lines = [line for line in r.iter_lines() if line]
    assert stack.call(call_id)["cold"] is True
    comments = [line for line in lines if line.startswith(":")]
    data = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
    assert comments, "no SSE comment was sent while the replica started"
    assert data[-1] == "[DONE]"
    text = "".join(json.loads(d)["choices"][0]["text"] for d in data[:-1])
    assert text == generate_text(model_dir, prompt_ids(model_dir, "The quick brown fox"), 12)


def test_models_lists_each_function_and_adapter(stack: Stack) -> None:
    ids = [m.id for m in sdk(stack).models.list()]
    assert ids == [FUNCTION, f"{FUNCTION}:pirate"]


def test_chat_equals_generate_on_the_chat_template(stack: Stack, model_dir: Path) -> None:
    client = sdk(stack)
    reply = client.chat.completions.create(
        model=FUNCTION,
        messages=[{"role": "user", "content": [{"type": "text", "text": "Hello"}]}],
        max_completion_tokens=16,
        temperature=0,
    )
    want = generate_text(model_dir, chat_ids(model_dir, "Hello"), 16)
    assert reply.choices[0].message.content == want
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == len(chat_ids(model_dir, "Hello"))
    assert 1 <= reply.usage.completion_tokens <= 16
    call = stack.call(reply.id.removeprefix("chatcmpl-"))
    assert call["status"] == "succeeded"
    assert call["timings_ms"]["ttft"] > 0
    if reply.usage.completion_tokens > 1:
        assert call["timings_ms"]["tpot"] > 0


def test_a_repetition_penalty_equals_generates_and_penalties_reach_the_replica(
    stack: Stack, model_dir: Path
) -> None:
    client = sdk(stack)
    ids = prompt_ids(model_dir, "one two one two one two")
    penalised = client.completions.create(
        model=FUNCTION,
        prompt=ids,
        max_tokens=24,
        temperature=0,
        extra_body={"repetition_penalty": 1.8, "ignore_eos": True},
    )
    want = generate_text(model_dir, ids, 24, repetition_penalty=1.8, min_new_tokens=24)
    assert penalised.choices[0].text == want
    assert want != generate_text(model_dir, ids, 24, min_new_tokens=24)
    # OpenAI's own, through the SDK: a strong frequency penalty changes the answer
    plain, frequent = (
        client.completions.create(
            model=FUNCTION,
            prompt=ids,
            max_tokens=24,
            temperature=0,
            frequency_penalty=penalty,
            extra_body={"ignore_eos": True},
        )
        .choices[0]
        .text
        for penalty in (0.0, 2.0)
    )
    assert frequent != plain
    with pytest.raises(openai.BadRequestError, match="min_p"):
        client.completions.create(model=FUNCTION, prompt="x", extra_body={"min_p": 2})


def model_logprobs(model_dir: Path, ids: list[int], max_new_tokens: int) -> list[list[float]]:
    """Greedy ``generate``'s raw log-softmax at each new token, as lists."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens,
            output_logits=True,
            return_dict_in_generate=True,
        )
    return [step[0].float().log_softmax(-1).tolist() for step in out.logits]


def test_logprobs_through_the_sdk_are_the_models_own(stack: Stack, model_dir: Path) -> None:
    client = sdk(stack)
    ids = prompt_ids(model_dir, "Where every millisecond went")
    expected = model_logprobs(model_dir, ids, 10)
    args: dict[str, Any] = {"model": FUNCTION, "prompt": ids, "max_tokens": 10, "temperature": 0}
    text = client.completions.create(**args, logprobs=3, extra_body={"ignore_eos": True})
    made = text.choices[0].logprobs
    assert made is not None and made.token_logprobs is not None and made.top_logprobs is not None
    assert len(made.token_logprobs) == 10
    for got, want, top in zip(made.token_logprobs, expected, made.top_logprobs, strict=True):
        assert got == pytest.approx(max(want), abs=1e-4)  # greedy: the most likely token's
        best = sorted(want, reverse=True)[:3]  # tokens of the same text are one entry
        assert max(top.values()) == pytest.approx(best[0], abs=1e-4)
        assert all(any(v == pytest.approx(b, abs=1e-4) for b in best) for v in top.values())
    assert made.text_offset is not None and made.text_offset[0] == 0
    # chat, unstreamed and streamed: the same entries, in the SDK's own types
    chat: dict[str, Any] = {
        "model": FUNCTION,
        "messages": [{"role": "user", "content": "Count the tokens"}],
        "max_tokens": 12,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
    }
    whole = client.chat.completions.create(**chat).choices[0]
    assert whole.logprobs is not None and whole.logprobs.content is not None
    entries = whole.logprobs.content
    usage = client.chat.completions.create(**chat).usage
    assert usage is not None and len(entries) == usage.completion_tokens
    assert all(len(e.top_logprobs) == 2 and e.top_logprobs[0].token == e.token for e in entries)
    assert (
        bytes(b for e in entries for b in e.bytes or [])
        .decode(errors="replace")
        .startswith(whole.message.content or "")
    )
    streamed = [
        e
        for chunk in client.chat.completions.create(**chat, stream=True)
        for choice in chunk.choices
        for e in (choice.logprobs.content or [] if choice.logprobs else [])
    ]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in entries]
    plain = client.chat.completions.create(**{**chat, "logprobs": False, "top_logprobs": None})
    assert plain.choices[0].logprobs is None
    with pytest.raises(openai.BadRequestError, match="top_logprobs needs logprobs"):
        client.chat.completions.create(**{**chat, "logprobs": None})


def test_a_logit_bias_through_the_sdk_forces_and_bans(stack: Stack, model_dir: Path) -> None:
    from transformers import AutoTokenizer

    client = sdk(stack)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    args: dict[str, Any] = {"model": FUNCTION, "prompt": "The fox", "max_tokens": 6}
    forced = client.completions.create(**args, temperature=1.0, logit_bias={"100": 100})
    assert forced.choices[0].text == tokenizer.decode([100] * 6)
    greedy = client.completions.create(**args, temperature=0, logprobs=0)
    assert greedy.choices[0].logprobs is not None
    first = greedy.choices[0].logprobs.tokens or []
    ids = tokenizer("The fox")["input_ids"]
    top = model_logprobs(model_dir, ids, 1)[0]
    best = max(range(len(top)), key=top.__getitem__)
    banned = client.completions.create(**args, temperature=0, logit_bias={str(best): -100})
    assert first and not banned.choices[0].text.startswith(first[0])
    with pytest.raises(openai.BadRequestError, match="outside this model's vocabulary"):
        client.completions.create(**args, logit_bias={"99999": 1})


def test_a_stream_joined_equals_the_same_call_unstreamed(stack: Stack) -> None:
    client = sdk(stack)
    args: dict[str, Any] = {
        "model": FUNCTION,
        "messages": [{"role": "user", "content": "Every millisecond"}],
        "max_tokens": 40,
        "temperature": 0,
    }
    whole = client.chat.completions.create(**args)
    chunks = list(
        client.chat.completions.create(**args, stream=True, stream_options={"include_usage": True})
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    # A warm stream's outputs reach it in memory; every one is also in the call's record.
    stored = stored_outputs(stack, chunks[0].id.removeprefix("chatcmpl-"))
    assert [seq for seq, _ in stored] == list(range(1, len(stored) + 1))
    assert "".join(out["text"] for _, out in stored) == text
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens  # type: ignore[union-attr]


def stored_outputs(stack: Stack, call_id: str) -> list[tuple[int, Any]]:
    """The call's outputs as its record holds them (the stack's database)."""
    db = Database(stack.backend.database_url)
    try:
        with db.session() as session:
            return calls.outputs_after(session, call_id, 1, 0)
    finally:
        db.dispose()


def test_a_load_generators_request_runs_to_max_tokens_with_usage_on_every_chunk(
    stack: Stack,
) -> None:
    """guidellm's body: vLLM's ``ignore_eos`` and ``continuous_usage_stats``, ``stop: null``."""
    body = {
        "model": FUNCTION,
        "prompt": "A load generator fixes the output length",
        "max_tokens": 24,
        "stop": None,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    headers = {"Authorization": f"Bearer {stack.admin_key}"}
    with (
        httpx.Client(base_url=stack.url, timeout=120) as c,
        c.stream("POST", "/openai/v1/completions", json=body, headers=headers) as r,
    ):
        assert r.status_code == 200, r.read()
        data = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data:")]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    final = chunks[-1]
    assert final["choices"] == [] and final["usage"]["completion_tokens"] == 24
    with_choices = chunks[:-1]
    assert all(c["usage"] is not None for c in with_choices), "a chunk came without usage"
    so_far = [c["usage"]["completion_tokens"] for c in with_choices]
    assert so_far == sorted(so_far) and so_far[-1] == 24
    assert {c["usage"]["prompt_tokens"] for c in chunks} == {final["usage"]["prompt_tokens"]}
    assert with_choices[-1]["choices"][0]["finish_reason"] == "length"


def test_an_adapter_by_function_colon_adapter(stack: Stack) -> None:
    client = sdk(stack)
    args: dict[str, Any] = {"prompt": "Hello, world!", "max_tokens": 24, "temperature": 0}
    base = client.completions.create(model=FUNCTION, **args).choices[0].text
    pirate = client.completions.create(model=f"{FUNCTION}:pirate", **args).choices[0].text
    assert pirate != base  # the adapter's B matrices are far from zero
    assert client.completions.create(model=FUNCTION, **args).choices[0].text == base


def generate_through(model_dir: Path, adapter_dir: Path, ids: list[int], n: int) -> str:
    """What ``generate`` says greedily for ``ids`` through the adapter (PEFT), decoded."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    base = AutoModelForCausalLM.from_pretrained(model_dir)
    model = PeftModel.from_pretrained(base, adapter_dir).eval()
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([ids]), do_sample=False, max_new_tokens=n)
    return str(tokenizer.decode(out[0, len(ids) :], skip_special_tokens=True))


def test_an_adapter_the_function_does_not_list_is_loaded_on_first_use(
    stack: Stack, stack_dir: Path, model_dir: Path
) -> None:
    adapter_dir = build_adapter(model_dir, stack_dir / "poet", seed=2)
    push_directory(adapter_dir, "tiny-poet:v1.2", Registry(LocalStore(stack_dir / "store")))
    request = {"prompt": "Hello, world!", "max_tokens": 24, "temperature": 0}
    want = generate_through(model_dir, adapter_dir, prompt_ids(model_dir, "Hello, world!"), 24)
    with stack.client() as c:
        texts = []
        for _ in range(2):  # loaded by the first, held for the second
            r = c.post(
                f"/v1/functions/{FUNCTION}/invoke",
                json={"input": request, "adapter": "tiny-poet:v1.2"},
            )
            assert r.status_code == 200, r.text
            texts.append(r.json()["output"]["text"])
        r = c.post(f"/v1/functions/{FUNCTION}/invoke", json={"input": request})
        base = r.json()["output"]["text"]
    assert texts == [want, want] and want != base
    assert base == generate_text(model_dir, prompt_ids(model_dir, "Hello, world!"), 24)
    # The OpenAI routes name it as function:NAME:TAG; one the store lacks is a 404.
    client = sdk(stack)
    args: dict[str, Any] = {"prompt": "Hello, world!", "max_tokens": 24, "temperature": 0}
    through = client.completions.create(model=f"{FUNCTION}:tiny-poet:v1.2", **args)
    assert through.choices[0].text == want
    with pytest.raises(openai.NotFoundError) as unknown:
        client.completions.create(model=f"{FUNCTION}:tiny-poet:v9", **args)
    assert "pushed to the store" in unknown.value.message


def test_stop_and_seed(stack: Stack) -> None:
    client = sdk(stack)
    args: dict[str, Any] = {"model": FUNCTION, "prompt": "A cold start", "max_tokens": 30}
    full = client.completions.create(**args, temperature=0).choices[0].text
    assert len(full) > 6, full
    stop = full[4:6]
    cut = client.completions.create(**args, temperature=0, stop=[stop]).choices[0]
    assert (cut.text, cut.finish_reason) == (full[: full.index(stop)], "stop")
    seeded = [
        client.completions.create(**args, temperature=1.0, seed=7).choices[0].text for _ in range(2)
    ]
    assert seeded[0] == seeded[1]
    # vLLM's top_k, as the SDK sends an extension: one token is the greedy one.
    top_one = client.completions.create(
        **args, temperature=1.5, seed=7, extra_body={"top_k": 1}
    ).choices[0]
    assert top_one.text == full


def test_bad_input_gets_openai_errors(stack: Stack) -> None:
    client = sdk(stack)
    chat: dict[str, Any] = {"model": FUNCTION, "messages": [{"role": "user", "content": "Hi"}]}
    with pytest.raises(openai.NotFoundError) as unknown:
        client.chat.completions.create(**{**chat, "model": "nope"})
    assert unknown.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(**{**chat, "model": f"{FUNCTION}:nope"})
    for bad, param in [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 201}, "max_tokens"),  # over max_tokens_limit
        ({"n": 2}, "n"),
        ({"logit_bias": {"one": 5}}, "logit_bias"),
        ({"messages": [{"role": "wizard", "content": "Hi"}]}, "messages.0.role"),
        ({"messages": []}, "messages"),
    ]:
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(**{**chat, **bad})
        assert refused.value.param == param, (bad, refused.value.body)
    with pytest.raises(openai.BadRequestError, match="unsupported parameter: tools"):
        client.chat.completions.create(**chat, extra_body={"tools": []})
    long = " ".join(["fox"] * 300)  # past the 256-token context
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError, match="context") as too_long:
            out = client.completions.create(model=FUNCTION, prompt=long, stream=stream)
            list(out)  # type: ignore[call-overload]
        assert too_long.value.param == "prompt"
    wrong_key = openai.OpenAI(
        base_url=f"{stack.url}/openai/v1", api_key="thaw_nope.nope", max_retries=0
    )
    with pytest.raises(openai.AuthenticationError):
        wrong_key.models.list()


def test_a_client_that_leaves_mid_stream_frees_its_sequence(stack: Stack) -> None:
    """The call ends cancelled, and the replica's engine cancels the request (its own
    count of aborted requests goes up) and holds no running request after it."""
    client = sdk(stack)
    aborted = _engine_gauge(stack, "thaw_llm_num_requests_aborted")
    stream = client.completions.create(
        # Greedy, this model's "Hello" runs all 200 tokens: only the cancel ends it early.
        model=FUNCTION,
        prompt="Hello",
        max_tokens=200,
        temperature=0,
        stream=True,
    )
    next(iter(stream))
    call_id = stream.response.headers["x-thaw-call-id"]
    stream.close()
    deadline = time.monotonic() + 10
    while stack.call(call_id)["status"] != "cancelled":
        assert time.monotonic() < deadline, stack.call(call_id)
        time.sleep(0.05)
    until = time.monotonic() + 20
    while _engine_gauge(stack, "thaw_llm_num_requests_aborted") < aborted + 1:
        assert time.monotonic() < until, "the replica's engine never cancelled the request"
        time.sleep(0.1)
    while _engine_gauge(stack, "thaw_llm_num_requests_running") != 0:
        assert time.monotonic() < until, "the engine still runs the request"
        time.sleep(0.1)


def _engine_gauge(stack: Stack, name: str) -> float:
    """An engine gauge of the function's one replica (0 before it reported)."""
    values = [v for series, v in llm_metrics(stack).items() if series.startswith(name + "{")]
    assert len(values) <= 1, values
    return values[0] if values else 0.0


def test_eight_concurrent_streams_share_engine_steps(stack: Stack) -> None:
    """Eight streams at once to the one replica: its engine's own count says its running
    batch held several of them at once (not one stream after another), and all end."""
    peak = "thaw_llm_num_requests_running_max"
    assert _engine_gauge(stack, peak) <= 1  # every earlier test called one at a time (keep
    # tests that call at once below this one)

    async def one(client: openai.AsyncOpenAI, i: int) -> int:
        stream = await client.completions.create(
            model=FUNCTION,
            prompt=f"Hello {i}",
            max_tokens=32,
            temperature=1.0,
            seed=i,
            stream=True,
            stream_options={"include_usage": True},
        )
        usage = [chunk.usage async for chunk in stream if chunk.usage is not None]
        return usage[0].completion_tokens

    async def all_streams() -> list[int]:
        client = openai.AsyncOpenAI(
            base_url=f"{stack.url}/openai/v1", api_key=stack.admin_key, max_retries=0
        )
        async with client:
            return await asyncio.gather(*(one(client, i) for i in range(MAX_NUM_SEQS)))

    tokens = asyncio.run(all_streams())
    assert len(tokens) == MAX_NUM_SEQS and all(n >= 1 for n in tokens)
    deadline = time.monotonic() + 20
    while _engine_gauge(stack, peak) < 2:
        assert time.monotonic() < deadline, llm_metrics(stack)
        time.sleep(0.1)


def test_a_callers_bad_prompt_or_temperature_costs_no_other_caller(stack: Stack) -> None:
    """Token ids outside the vocabulary, or a temperature float32 holds as 0, failed the
    engine's step: transformers then failed every request in the batch and stopped its
    loop, and the replica answered no call after. Now they are 400s, and the stream
    beside them runs to its end."""
    client = sdk(stack)
    beside = client.completions.create(
        model=FUNCTION, prompt="Hello", max_tokens=200, temperature=0, stream=True
    )
    chunks = iter(beside)
    text = next(chunks).choices[0].text
    for bad, says in [
        ({"prompt": [5, 10**7]}, "token id 10000000 is outside this model's vocabulary"),
        ({"prompt": [-1]}, "token id -1"),
        ({"prompt": []}, "prompt is empty"),
    ]:
        with pytest.raises(openai.BadRequestError, match=says):
            client.completions.create(model=FUNCTION, max_tokens=4, **bad)  # type: ignore[call-overload]
    tiny = client.completions.create(model=FUNCTION, prompt="Hi", max_tokens=4, temperature=1e-300)
    assert tiny.usage is not None and tiny.usage.completion_tokens == 4
    last = None
    for chunk in chunks:
        text += chunk.choices[0].text
        last = chunk.choices[0].finish_reason or last
    assert last == "length"  # greedy "Hello" runs all 200 tokens (see below)
    again = client.completions.create(model=FUNCTION, prompt="Hello", max_tokens=200, temperature=0)
    assert again.choices[0].text == text


def test_the_replicas_engine_reports_its_graph_counts_none_off_a_gpu(stack: Stack) -> None:
    """The engine's CUDA graph counts reach /metrics per replica, from its worker's
    heartbeat, beside its load; this machine has no GPU, so the engine runs eagerly and
    both are 0."""
    sdk(stack).completions.create(model=FUNCTION, prompt="Graphs?", max_tokens=4)
    names = ("thaw_llm_cuda_graph_captures", "thaw_llm_cuda_graph_eager_steps")

    def exported() -> dict[str, float]:
        return {
            series: value
            for series, value in llm_metrics(stack).items()
            if series.startswith(tuple(name + "{" for name in names))
        }

    deadline = time.monotonic() + 20
    while len(exported()) < len(names):
        assert time.monotonic() < deadline, llm_metrics(stack)
        time.sleep(0.1)
    assert set(exported().values()) == {0.0}


def test_a_prompt_sent_again_is_found_in_the_prefix_cache_and_metrics_say_so(
    stack: Stack,
) -> None:
    """The second call of a prompt takes its first KV blocks from the cache; the
    replica's prefix-cache figures reach /metrics from its worker's heartbeat."""

    def total(name: str) -> float:
        prefix = name + "{"
        return sum(v for k, v in llm_metrics(stack).items() if k.startswith(prefix))

    hits_before = total("thaw_llm_prefix_cache_hits")
    prompt = "Our runbook says: check the pool, then the RAM tier, then the store. " * 2
    client = sdk(stack)
    texts = [
        client.completions.create(model=FUNCTION, prompt=prompt, max_tokens=8, temperature=0)
        .choices[0]
        .text
        for _ in range(2)
    ]
    assert texts[0] == texts[1]
    deadline = time.monotonic() + 20
    while total("thaw_llm_prefix_cache_hits") - hits_before < 64:  # one block at least
        assert time.monotonic() < deadline, llm_metrics(stack)
        time.sleep(0.1)
    assert total("thaw_llm_prefix_cache_queries") >= total("thaw_llm_prefix_cache_hits")


def test_a_call_lands_in_the_token_level_metrics_and_its_record(stack: Stack) -> None:
    before = llm_metrics(stack)
    reply = sdk(stack).completions.create(
        model=FUNCTION, prompt="Metrics, please", max_tokens=20, temperature=0
    )
    assert reply.usage is not None
    call = stack.call(reply.id.removeprefix("cmpl-"))
    timings = call["timings_ms"]
    assert 0 <= timings["engine_queue"] <= timings["ttft"]
    after = llm_metrics(stack)

    def grew(series: str) -> float:
        return after.get(series, 0.0) - before.get(series, 0.0)

    fn = f"function={FUNCTION}"
    warm = f"cold=false,{fn}"
    assert grew(f"thaw_llm_prompt_tokens_total{{{fn}}}") == reply.usage.prompt_tokens
    assert grew(f"thaw_llm_generation_tokens_total{{{fn}}}") == reply.usage.completion_tokens
    assert grew(f"thaw_llm_time_to_first_token_seconds_count{{{warm}}}") == 1
    assert grew(f"thaw_llm_e2e_request_latency_seconds_count{{{warm}}}") == 1
    gaps = grew(f"thaw_llm_inter_token_latency_seconds_count{{{fn}}}")
    assert gaps == reply.usage.completion_tokens - 1
    if gaps:
        assert grew(f"thaw_llm_inter_token_latency_seconds_sum{{{fn}}}") > 0
        assert 0 < timings["itl_p50"] <= timings["itl_p99"]


def test_loadtest_drives_the_openai_routes_and_agrees_with_the_server(stack: Stack) -> None:
    before = llm_metrics(stack)
    doc = run_loadtest(
        stack,
        f"{FUNCTION}:pirate",
        "--concurrency", "3", "--duration-s", "2", "--max-tokens", "16", "--ignore-eos",
        "--slo-ttft-ms", "60000", "--slo-tpot-ms", "10000",
    )  # fmt: skip
    check_loadtest(doc, before, llm_metrics(stack))
    assert doc["model"] == f"{FUNCTION}:pirate" and doc["concurrency"] == 3
    assert doc["completion_tokens"] == 16 * doc["calls"]  # --ignore-eos: all of max_tokens
    assert doc["goodput"]["share"] == 1.0  # SLOs no call here can miss


def test_loadtest_refuses_what_an_llm_function_cannot_take(stack: Stack) -> None:
    cases = {
        (f"{FUNCTION}:nope",): "the OpenAI routes do not serve 'chat:nope'",
        (FUNCTION, "--data", "{}"): "chat is an LLM function: give --prompt or --prompts",
        (FUNCTION, "--endpoint", "embeddings"): "--endpoint 'embeddings': choose chat",
        (FUNCTION, "--prompt", "a", "--prompts", "p.txt"): "not both",
    }
    for args, message in cases.items():
        result = loadtest_cli(stack, *args, "--concurrency", "1", "--duration-s", "1")
        assert result.exit_code != 0 and message in " ".join(result.output.split()), args
