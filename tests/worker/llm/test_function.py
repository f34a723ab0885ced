"""The LLM function entry (``worker.llm.function``) as the replica runs it: built with
its ``[llm]`` options from a thaw Context (the example's tiny Llama, its tokenizer and
chat template, a LoRA adapter), called with a ``CallContext``. Usage and token times
land in the call; a stream closed or cancelled mid-way leaves the engine at once;
calls of an adapter and of the base model share a batch (one adapter at a time with
``mixed_adapters`` off)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file

from control_plane.protocol import LLMOptions
from examples.build_model import build_adapter, build_model
from snapshotter.loader import LoadedTensors
from worker.call_cancel import CallCancelled, RunningCalls
from worker.frames import LENGTH
from worker.llm.function import LLMFunction, _timed
from worker.llm.serve import AdapterGate, LLMRequestError, TextDelta
from worker.pushed_calls import PushOut, StepFrames
from worker.replica_child import _output_frame
from worker.sdk import Adapter, CallContext, Context


def tensors_of(directory: Path, device: str = "cpu") -> LoadedTensors:
    """A model or adapter directory's safetensors on ``device``, as a load gives them."""
    weights = LoadedTensors()
    for shard in sorted(directory.glob("*.safetensors")):
        weights.update(load_file(shard, device=device))
    weights.report = None  # type: ignore[assignment]  # read from files, not the store
    return weights


def example_context(root: Path) -> Context:
    """The example's tiny Llama built under ``root``, with its "pirate" adapter."""
    model_dir = build_model(root / "model")
    adapter_dir = build_adapter(model_dir, root / "pirate", seed=1)
    adapter_config = json.loads((adapter_dir / "adapter_config.json").read_text())
    return Context(
        device="cpu",
        weights=tensors_of(model_dir),
        config=json.loads((model_dir / "config.json").read_text()),
        files=model_dir,
        adapters={"pirate": Adapter("pirate", tensors_of(adapter_dir), adapter_config)},
    )


@pytest.fixture(scope="module")
def function(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LLMFunction]:
    ctx = example_context(tmp_path_factory.mktemp("llm-function"))
    fn = LLMFunction(LLMOptions(max_num_seqs=4, kv_cache_mb=2, max_tokens_limit=64))
    fn.setup(ctx)
    yield fn
    fn.close()


def _call(stream: bool = False, adapter: str | None = None) -> CallContext:
    return CallContext("c1", adapter=adapter, stream=stream)


def test_a_call_reports_usage_and_token_times(function: LLMFunction) -> None:
    call = _call()
    out = function({"prompt": "Hello", "max_tokens": 12, "temperature": 0}, call)
    assert out["tokens"] == call.usage["completion_tokens"] >= 1
    assert call.usage["prompt_tokens"] == len(function.llm.text_prompt("Hello"))  # type: ignore[union-attr]
    assert out["finish_reason"] in ("stop", "length")
    timings = call.timings_ms
    assert 0 <= timings["engine_queue"] <= timings["ttft"]
    if out["tokens"] > 1:
        assert 0 < timings["itl_p50"] <= timings["itl_p99"]
        assert timings["itl_p50"] <= timings["tpot"] * out["tokens"]


def test_token_times_from_made_up_steps() -> None:
    """ttft from the call's start, engine_queue until the engine began, tpot the mean
    gap after the first token, and a step of 2 tokens as 2 equal gaps."""
    call = _call()
    steps = [
        TextDelta("a", 1, 10.5, None, 10.2),
        TextDelta("b", 1, 10.6, None, 10.2),
        TextDelta("cd", 2, 11.0, None, 10.2),
        TextDelta("e", 1, 11.1, "length", 10.2),
    ]
    assert [d.text for d in _timed((d for d in steps), 10.0, call)] == ["a", "b", "cd", "e"]
    t = call.timings_ms
    assert t["engine_queue"] == pytest.approx(200) and t["ttft"] == pytest.approx(500)
    assert t["tpot"] == pytest.approx(600 / 4)  # 5 tokens, 4 gaps: 100, 200, 200, 100
    assert t["itl_p50"] == pytest.approx(100) and t["itl_p99"] == pytest.approx(200)
    assert call.usage["completion_tokens"] == 5


def test_a_stream_joined_equals_the_whole_text(function: LLMFunction) -> None:
    request = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 20, "temperature": 0}
    whole = function(request, _call())
    chunks = list(function(request, _call(stream=True)))
    assert "".join(c["text"] for c in chunks) == whole["text"]
    assert sum(c["tokens"] for c in chunks) == whole["tokens"]
    assert chunks[-1]["finish_reason"] == whole["finish_reason"]


PROMPT = {"prompt": "Seven bridges cross the", "max_tokens": 16}


def test_top_k_one_samples_the_greedy_text(function: LLMFunction) -> None:
    greedy = function({**PROMPT, "temperature": 0}, _call())["text"]
    assert (
        function({**PROMPT, "temperature": 1.5, "top_k": 1, "seed": 3}, _call())["text"] == greedy
    )
    # All tokens (0 and -1 are both "off"): the same seeded draw either way, not greedy.
    every = [
        function({**PROMPT, "temperature": 1.5, "top_k": k, "seed": 3}, _call()) for k in (0, -1)
    ]
    assert every[0]["text"] == every[1]["text"] != greedy


def test_a_call_with_logprobs_has_one_per_token_naming_its_text(function: LLMFunction) -> None:
    request = {**PROMPT, "temperature": 0, "ignore_eos": True, "logprobs": 3}
    out = function(request, _call())
    logprobs = out["logprobs"]
    assert len(logprobs) == out["tokens"] == 16
    # the tokens' own bytes make the text (a random model cuts characters: their
    # tokens' texts hold U+FFFD, the text has the characters they make whole)
    joined = bytes(b for e in logprobs for b in e["bytes"])
    assert joined.decode("utf-8", errors="replace") == out["text"]
    for entry in logprobs:
        assert entry["logprob"] <= 0 and len(entry["top_logprobs"]) == 3
        best = entry["top_logprobs"][0]  # greedy: the token is the most likely
        assert (best["token"], best["logprob"]) == (entry["token"], entry["logprob"])
    assert "logprobs" not in function({**PROMPT, "temperature": 0}, _call())
    chunks = list(function(request, _call(stream=True)))
    assert [e for c in chunks for e in c.get("logprobs", [])] == logprobs


def test_logprobs_are_the_models_own_whatever_the_sampling(function: LLMFunction) -> None:
    """The same tokens, forced by top_k 1 under a temperature and a penalty that change
    the sampled distribution: the same logprobs as greedy's (raw, before sampling)."""
    base = {**PROMPT, "ignore_eos": True, "logprobs": 2}
    greedy = function({**base, "temperature": 0}, _call())
    hot = function({**base, "temperature": 1.7, "top_k": 1, "min_p": 0.5}, _call())
    assert hot["text"] == greedy["text"]
    for a, b in zip(hot["logprobs"], greedy["logprobs"], strict=True):
        assert a["token"] == b["token"]
        assert a["logprob"] == pytest.approx(b["logprob"], abs=1e-5)


def test_a_logit_bias_forces_a_token(function: LLMFunction) -> None:
    llm = function.llm
    assert llm is not None
    token = 100
    forced = function({**PROMPT, "temperature": 0.8, "logit_bias": {str(token): 100}}, _call())
    assert forced["text"] == llm.tokenizer.decode([token] * 16)
    plain = function({**PROMPT, "temperature": 0, "ignore_eos": True}, _call())
    assert plain["text"] != forced["text"]


def _function_over(model_dir: Path) -> LLMFunction:
    config = json.loads((model_dir / "config.json").read_text())
    ctx = Context(device="cpu", weights=tensors_of(model_dir), config=config, files=model_dir)
    fn = LLMFunction(LLMOptions(max_num_seqs=2, kv_cache_mb=1, max_tokens_limit=64))
    fn.setup(ctx)
    return fn


def _with_generation_config(model_dir: Path, **values: Any) -> Path:
    path = model_dir / "generation_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **values}))
    return model_dir


def test_what_a_call_leaves_out_is_sampled_as_the_models_generation_config_says(
    function: LLMFunction, tmp_path: Path
) -> None:
    """The authors' values in generation_config.json (here top_k 1: greedy) are the
    defaults, as vLLM and SGLang take them; what a call names still wins."""
    model_dir = _with_generation_config(build_model(tmp_path / "model"), temperature=1.5, top_k=1)
    fn = _function_over(model_dir)
    try:
        greedy = fn({**PROMPT, "temperature": 0}, _call())["text"]
        assert fn({**PROMPT, "seed": 3}, _call())["text"] == greedy
        named = fn({**PROMPT, "seed": 3, "top_k": 0}, _call())["text"]
        assert named == fn({**PROMPT, "seed": 3, "top_k": 0, "temperature": 1.5}, _call())["text"]
        assert named != greedy
    finally:
        fn.close()
    # A model that names none: OpenAI's (temperature 1, top_p 1, every token).
    openai = {"temperature": 1.0, "top_p": 1.0, "top_k": 0}
    left_out = function({**PROMPT, "seed": 3}, _call())["text"]
    assert left_out == function({**PROMPT, "seed": 3, **openai}, _call())["text"]


@pytest.mark.parametrize(
    ("values", "says"),
    [({"top_p": 0}, "top_p = 0"), ({"temperature": "warm"}, "temperature = 'warm'")],
)
def test_a_generation_config_no_call_could_sample_with_is_refused_at_setup(
    tmp_path: Path, values: dict[str, Any], says: str
) -> None:
    model_dir = _with_generation_config(build_model(tmp_path / "model"), **values)
    with pytest.raises(ValueError, match=f"generation_config.json has {says}"):
        _function_over(model_dir)


def _wait_idle(function: LLMFunction) -> None:
    engine = function.llm.engine  # type: ignore[union-attr]
    deadline = time.monotonic() + 5
    while engine.active_requests():
        assert time.monotonic() < deadline, "the engine still holds the request"
        time.sleep(0.01)


def test_closing_a_stream_frees_its_sequence(function: LLMFunction) -> None:
    engine = function.llm.engine  # type: ignore[union-attr]
    aborted = engine.aborted
    stream = function({"prompt": "Hello", "max_tokens": 64, "temperature": 1.0}, _call(True))
    next(stream)
    assert engine.active_requests() == 1
    stats = function.engine_stats()
    assert stats is not None and stats.running + stats.waiting == 1
    assert 0 < stats.kv_cache_usage <= 1 and stats.peak_running >= 1
    stream.close()
    _wait_idle(function)
    stats = function.engine_stats()
    assert stats is not None and (stats.running, stats.waiting) == (0, 0)
    assert stats.kv_cache_usage == 0  # blocks kept only for prefix reuse count as free
    assert stats.aborted == aborted + 1


def test_a_cancel_in_the_call_thread_frees_its_sequence(function: LLMFunction) -> None:
    """As the replica cancels a call whose client left: ``CallCancelled`` raised in the
    thread that iterates the stream (``worker.call_cancel``)."""
    engine = function.llm.engine  # type: ignore[union-attr]
    running = RunningCalls()
    first = threading.Event()
    ended: list[BaseException] = []

    def run() -> None:
        running.enter("c1")
        try:
            for _ in function({"prompt": "Hi", "max_tokens": 64, "temperature": 1.0}, _call(True)):
                first.set()
                time.sleep(0.02)  # a slow reader: the request is still running
        except CallCancelled as exc:
            ended.append(exc)
        finally:
            running.leave("c1")

    thread = threading.Thread(target=run)
    thread.start()
    assert first.wait(10)
    assert engine.active_requests() == 1
    running.cancel("c1")
    thread.join(5)
    assert ended and not thread.is_alive()
    _wait_idle(function)


def test_an_adapter_changes_the_text_and_the_base_comes_back(function: LLMFunction) -> None:
    request = {"prompt": "Hello, world!", "max_tokens": 24, "temperature": 0}
    base = function(request, _call())["text"]
    pirate = function(request, _call(adapter="pirate"))["text"]
    assert pirate != base
    assert function(request, _call())["text"] == base
    with pytest.raises(LLMRequestError, match="unknown adapter 'nope'"):
        function(request, _call(adapter="nope"))


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ("text", "an object"),
        ({"prompt": "a", "messages": []}, "either"),
        ({"prompt": 3}, "prompt"),
        ({"prompt": "a", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "a", "max_tokens": 65}, "max_tokens_limit"),
        ({"messages": [{"role": "user"}]}, "each message"),
        ({"prompt": "a", "stop": "x"}, "stop"),
        # Each token is scanned for every stop string in the router all streams share.
        ({"prompt": "a", "stop": list("abcde")}, "at most 4 strings"),
        ({"prompt": "a", "stop": ["x" * 1025]}, "of at most 1024 characters"),
        ({"prompt": "a", "temperature": "hot"}, "temperature"),
        # Each of these would have failed the engine's step, and every call in it.
        ({"prompt": [5, 10**6]}, "token id 1000000 is outside this model's vocabulary"),
        ({"prompt": [-2]}, "token id -2"),
        ({"prompt": "a", "temperature": float("nan")}, "temperature"),
        ({"prompt": "a", "top_p": float("nan")}, "top_p"),
        ({"prompt": "a", "top_k": -2}, "top_k"),
        ({"prompt": "a", "top_k": 1.5}, "top_k"),
        ({"prompt": "a", "logprobs": 21}, "logprobs"),
        ({"prompt": "a", "logprobs": True}, "logprobs"),
        ({"prompt": "a", "logprobs": -1}, "logprobs"),
        ({"prompt": "a", "logit_bias": [1, 2]}, "logit_bias"),
        ({"prompt": "a", "logit_bias": {"the": 1}}, "a key is a token id"),
        ({"prompt": "a", "logit_bias": {"²": 1}}, "a key is a token id"),
        ({"prompt": "a", "logit_bias": {"5": "up"}}, "a number from -100 to 100"),
        ({"prompt": "a", "logit_bias": {"5": 101}}, "from -100 to 100"),
        ({"prompt": "a", "logit_bias": {"99999999": 1}}, "outside this model's vocabulary"),
    ],
)
def test_bad_input_is_a_request_error(function: LLMFunction, bad: Any, says: str) -> None:
    with pytest.raises(LLMRequestError, match=says):
        function(bad, _call())


def test_calls_of_an_adapter_and_of_the_base_share_a_batch_and_answer_as_alone(
    function: LLMFunction,
) -> None:
    llm = function.llm
    assert llm is not None and llm.gate is None and llm.routing is not None
    requests = [{"prompt": p, "max_tokens": 20, "temperature": 0} for p in ("Hi", "Hello there")]
    names = [None, "pirate"]
    alone = {(i, a): function(requests[i], _call(adapter=a))["text"] for i in (0, 1) for a in names}
    mixed_before = llm.routing.mixed_steps
    start = threading.Barrier(4)

    def one(i: int, adapter: str | None) -> str:
        start.wait()
        return str(function(requests[i], _call(adapter=adapter))["text"])

    jobs = [(i, a) for i in (0, 1) for a in names]
    with ThreadPoolExecutor(4) as pool:
        together = dict(zip(jobs, pool.map(lambda job: one(*job), jobs), strict=True))
    assert together == alone
    assert alone[(1, None)] != alone[(1, "pirate")]
    assert llm.routing.mixed_steps > mixed_before  # they ran in the same steps


def test_with_mixed_adapters_off_the_gate_runs_them_one_at_a_time(tmp_path: Path) -> None:
    fn = LLMFunction(LLMOptions(max_num_seqs=4, kv_cache_mb=2, mixed_adapters=False))
    fn.setup(example_context(tmp_path))
    try:
        assert fn.llm is not None and fn.llm.routing is None and fn.llm.gate is not None
        request = {"prompt": "Hello, world!", "max_tokens": 24, "temperature": 0}
        base = fn(request, _call())["text"]
        assert fn(request, _call(adapter="pirate"))["text"] != base
        assert fn(request, _call())["text"] == base
    finally:
        fn.close()


def test_the_gate_runs_one_adapter_at_a_time_and_starves_none() -> None:
    switches: list[str | None] = []
    gate = AdapterGate(switches.append)
    log: list[str] = []
    a1 = gate.hold("a")
    a1.__enter__()
    entered = threading.Event()

    def take(name: str | None, tag: str) -> None:
        with gate.hold(name):
            log.append(tag)
            entered.set()

    b = threading.Thread(target=take, args=("b", "b"))
    b.start()
    time.sleep(0.2)
    late_a = threading.Thread(target=take, args=("a", "a-late"))
    late_a.start()
    time.sleep(0.2)
    assert log == []  # b waits for a1; the later "a" waits behind b
    a1.__exit__(None, None, None)
    b.join(5)
    late_a.join(5)
    assert log == ["b", "a-late"]
    assert switches == ["a", "b", "a"]


class _Sent:
    """What a replica's step frames sent to the agent, write by write."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.after_write: Callable[[], None] | None = None  # in the engine's router thread

    def __call__(self, data: bytes) -> None:
        self.writes.append(data)
        if self.after_write is not None:
            self.after_write()

    def chunks(self, call_id: str) -> list[dict[str, Any]]:
        out = []
        for data in self.writes:
            at = 0
            while at < len(data):
                (size,) = LENGTH.unpack_from(data, at)
                frame = json.loads(data[at + LENGTH.size : at + LENGTH.size + size])
                at += LENGTH.size + size
                if frame["call_id"] == call_id:
                    out.append(frame["chunk"])
        return out


@pytest.fixture(scope="module")
def step_frames(function: LLMFunction) -> tuple[StepFrames, _Sent]:
    sent = _Sent()
    frames = StepFrames(sent)
    function.add_step_listener(frames.flush)
    return frames, sent


def _as_read(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """A stream's chunks as its reader ends up with them, however they were grouped:
    the text joined, the tokens summed, the other fields as last given."""
    read: dict[str, Any] = {}
    for chunk in chunks:
        read.update({k: v for k, v in chunk.items() if k not in ("text", "tokens")})
    read["text"] = "".join(c["text"] for c in chunks)
    read["tokens"] = sum(c["tokens"] for c in chunks)
    return read


def _push(
    function: LLMFunction, frames: StepFrames, request: dict[str, Any], call: CallContext
) -> PushOut:
    out = PushOut(frames, partial(_output_frame, call.call_id), time.perf_counter(), {})
    function.push_call(request, call, out)
    assert out.done.is_set()  # its end was sent before the call returned
    return out


def test_a_pushed_stream_is_the_pulled_stream_sent_a_step_at_a_time(
    function: LLMFunction, step_frames: tuple[StepFrames, _Sent]
) -> None:
    frames, sent = step_frames
    request = {"messages": [{"role": "user", "content": "Hey"}], "max_tokens": 16, "temperature": 0}
    pulled = list(function(request, _call(stream=True)))
    call = CallContext("pushed-1", stream=True)
    _push(function, frames, request, call)
    pushed = sent.chunks("pushed-1")
    # text, tokens, prompt_tokens, finish, usage; a pulled stream's thread joins the
    # steps that piled up while it was busy into one chunk, a pushed one never does
    assert _as_read(pushed) == _as_read(pulled)
    assert len(pushed) >= len(pulled)
    assert call.usage["completion_tokens"] == sum(c["tokens"] for c in pulled)
    assert 0 <= call.timings_ms["engine_queue"] <= call.timings_ms["ttft"]
    if call.usage["completion_tokens"] > 1:
        assert call.timings_ms["tpot"] > 0 and len(call.token_gaps_ms) > 1


def test_a_pushed_stream_carries_the_logprobs_of_the_pulled_one(
    function: LLMFunction, step_frames: tuple[StepFrames, _Sent]
) -> None:
    frames, sent = step_frames
    request = {**PROMPT, "temperature": 0, "ignore_eos": True, "logprobs": 1}
    pulled = [e for c in function(request, _call(stream=True)) for e in c.get("logprobs", [])]
    _push(function, frames, request, CallContext("pushed-logprobs", stream=True))
    pushed = [e for c in sent.chunks("pushed-logprobs") for e in c.get("logprobs", [])]
    assert len(pushed) == 16 and pushed == pulled


def test_pushed_streams_share_a_write_per_step(
    function: LLMFunction, step_frames: tuple[StepFrames, _Sent]
) -> None:
    frames, sent = step_frames
    sent.writes.clear()
    request = {"prompt": "Once upon", "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    calls = [CallContext(f"many-{i}", stream=True) for i in range(4)]
    threads = [threading.Thread(target=_push, args=(function, frames, request, c)) for c in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    texts = {"".join(c["text"] for c in sent.chunks(call.call_id)) for call in calls}
    assert len(texts) == 1  # greedy: the same text for each
    shared = [w for w in sent.writes if w.count(b'"call_id":"many-') > 1]
    assert shared, "no step's chunks for several calls went in one write"
    assert len(sent.writes) < sum(len(sent.chunks(c.call_id)) for c in calls)


def test_a_stop_string_ends_a_pushed_stream_and_frees_its_sequence(
    function: LLMFunction, step_frames: tuple[StepFrames, _Sent]
) -> None:
    frames, sent = step_frames
    request = {"prompt": "Hello", "max_tokens": 40, "temperature": 0, "ignore_eos": True}
    whole = function(request, _call())["text"]
    stop = whole[len(whole) // 2 : len(whole) // 2 + 2]
    assert stop.strip(), "the text has a stop string to find"
    call = CallContext("stopped", stream=True)
    _push(function, frames, {**request, "stop": [stop]}, call)
    chunks = sent.chunks("stopped")
    assert chunks[-1]["finish_reason"] == "stop"
    assert "".join(c["text"] for c in chunks) == whole[: whole.find(stop)]
    _wait_idle(function)


def test_a_cancel_in_a_pushed_calls_thread_frees_its_sequence(
    function: LLMFunction, step_frames: tuple[StepFrames, _Sent]
) -> None:
    frames, sent = step_frames
    engine = function.llm.engine  # type: ignore[union-attr]
    aborted = engine.aborted
    running = RunningCalls()
    ended: list[BaseException] = []
    call = CallContext("cancelled", stream=True)
    cancelled = threading.Event()

    def run() -> None:
        running.enter(call.call_id)
        try:
            request = {"prompt": "Hi", "max_tokens": 64, "temperature": 1.0, "ignore_eos": True}
            _push(function, frames, request, call)
        except CallCancelled as exc:
            ended.append(exc)
        finally:
            running.leave(call.call_id)

    def cancel_at_the_first_chunk() -> None:
        # In the router's thread, which hands over no further step meanwhile: the call is
        # cancelled with its sequence unfinished however slow its own thread is to see it.
        if not cancelled.is_set() and sent.chunks("cancelled"):
            cancelled.set()
            running.cancel(call.call_id)
            deadline = time.monotonic() + 5
            while not ended and time.monotonic() < deadline:
                time.sleep(0.005)

    sent.after_write = cancel_at_the_first_chunk
    thread = threading.Thread(target=run)
    thread.start()
    thread.join(10)
    sent.after_write = None
    assert cancelled.is_set(), "no chunk was pushed"
    assert ended and not thread.is_alive()
    _wait_idle(function)
    assert engine.aborted == aborted + 1
    n = len(sent.chunks("cancelled"))
    time.sleep(0.2)
    assert len(sent.chunks("cancelled")) == n  # nothing pushed after the cancel
    assert "finish_reason" not in sent.chunks("cancelled")[-1]


def test_a_pushed_call_for_an_unknown_adapter_is_a_request_error(
    function: LLMFunction, step_frames: tuple[StepFrames, _Sent]
) -> None:
    frames, _sent = step_frames
    with pytest.raises(LLMRequestError, match="unknown adapter"):
        _push(function, frames, {"prompt": "Hi"}, _call(stream=True, adapter="nope"))


def test_the_engine_stats_count_graph_captures_and_eager_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Graphs tried on the CPU (where transformers runs every step eagerly), on a function
    without adapters: its engine's gate counts a call's shapes held back the first time
    and let through when the same call comes again, and the stats carry both counts."""
    import worker.llm.engine as engine_module

    monkeypatch.setattr(engine_module, "can_graph", lambda m: True)
    model_dir = build_model(tmp_path / "model")
    ctx = Context(
        device="cpu",
        weights=tensors_of(model_dir),
        config=json.loads((model_dir / "config.json").read_text()),
        files=model_dir,
    )
    fn = LLMFunction(LLMOptions(max_num_seqs=2, kv_cache_mb=2, max_tokens_limit=16))
    fn.setup(ctx)
    try:
        before = fn.engine_stats()
        assert before is not None and (before.graph_captures, before.graph_eager_steps) == (0, 0)
        request = {"prompt": "Graphs", "max_tokens": 4, "temperature": 0}
        first = fn(request, _call())
        held = fn.engine_stats()
        assert held is not None and held.graph_eager_steps > 0 and held.graph_captures == 0
        assert fn(request, _call()) == first
        after = fn.engine_stats()
        assert after is not None and after.graph_captures > 0
        assert after.graph_eager_steps == held.graph_eager_steps
    finally:
        fn.close()


def test_the_engine_stats_of_an_engine_without_graphs_count_none(function: LLMFunction) -> None:
    function({"prompt": "Eager", "max_tokens": 3, "temperature": 0}, _call())
    stats = function.engine_stats()
    assert stats is not None and (stats.graph_captures, stats.graph_eager_steps) == (0, 0)


def test_the_stats_of_an_engine_that_cannot_run_again_end_the_replica(
    function: LLMFunction, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Raised to the engine reporter, which exits the replica (``worker.engine_report``)."""
    from worker.llm.engine import EngineDeadError

    assert function.llm is not None
    monkeypatch.setattr(function.llm.engine, "dead", "RuntimeError: the device is gone")
    with pytest.raises(EngineDeadError, match="the device is gone"):
        function.engine_stats()


def test_an_input_key_the_function_does_not_take_is_refused_by_name() -> None:
    from worker.llm.function import _request
    from worker.llm.serve import LLMRequestError

    with pytest.raises(LLMRequestError, match=r"has no 'temprature': it takes .*temperature"):
        _request({"prompt": "x", "temprature": 0.5})
    assert _request({"prompt": "x", "frequency_penalty": 1})["frequency_penalty"] == 1.0
