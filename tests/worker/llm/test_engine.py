"""The continuous-batching engine on a tiny Llama built here (random weights, fp32):
greedy output in a batch equals ``model.generate`` on each prompt alone; concurrent
requests share engine steps; a seeded request gives the same tokens whatever shares
its batch; a request left early frees its sequence."""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Generator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch

from worker.llm.engine import (
    CaptureGate,
    Engine,
    EngineDeadError,
    EngineError,
    EngineSizes,
    Sampling,
    TokenStep,
    _with_waiting,
    kv_blocks,
)
from worker.sdk import ReplicaLost

VOCAB = 256
EOS = 2


def tiny_llama() -> Any:
    """A 2-layer Llama of random weights, fp32, sdpa, on the CPU."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        eos_token_id=EOS,
        bos_token_id=1,
    )
    m = LlamaForCausalLM(config).eval()
    m.config._attn_implementation = "sdpa"
    return m


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    lengths = [3, 9, 17, 30, 5, 44]
    return [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in lengths]


def generate_alone(model: Any, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Greedy ``model.generate`` of ``prompt`` by itself, on the model's device."""
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt], device=model.device),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=model.device),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            eos_token_id=EOS,
            pad_token_id=0,
        )
    return list(out[0, len(prompt) :].tolist())


def run_to_end(engine: Engine, prompt: list[int], sampling: Sampling) -> tuple[list[int], str]:
    tokens: list[int] = []
    reason = ""
    for step in engine.generate(prompt, sampling):
        tokens += step.token_ids
        reason = step.finish_reason or reason
    return tokens, reason


def test_kv_cache_is_sized_from_the_setting(model: Any) -> None:
    # 2 layers x 2 kv heads x 16 dims x (k, v) x 4 bytes = 512 bytes a token.
    sizes = EngineSizes(kv_cache_bytes=1 << 20, page_size_tokens=64)
    assert kv_blocks(model.config, torch.float32, sizes) == (1 << 20) // (512 * 64)


def test_greedy_in_one_batch_equals_generate_alone(model: Any, engine: Engine) -> None:
    prompts = _prompts()
    sampling = Sampling(max_new_tokens=24)
    start = threading.Barrier(len(prompts))

    def one(prompt: list[int]) -> tuple[list[int], str]:
        start.wait()  # all at once: they share the batch
        return run_to_end(engine, prompt, sampling)

    with ThreadPoolExecutor(len(prompts)) as pool:
        results = list(pool.map(one, prompts))
    for prompt, (tokens, reason) in zip(prompts, results, strict=True):
        expected = generate_alone(model, prompt, 24)
        assert tokens == expected
        assert reason == ("stop" if expected[-1] == EOS else "length")
    assert engine.peak_active > 1, "the requests never shared a batch"


def test_eight_streams_share_engine_steps(engine: Engine) -> None:
    engine.peak_active = 0
    prompts = [p[:8] for p in _prompts()] + [[5, 6, 7], [9, 10, 11, 12]]
    start = threading.Barrier(8)

    def one(prompt: list[int]) -> int:
        start.wait()
        return len(run_to_end(engine, prompt, Sampling(max_new_tokens=32, stop_token_ids=()))[0])

    with ThreadPoolExecutor(8) as pool:
        counts = list(pool.map(one, prompts[:8]))
    assert all(n >= 1 for n in counts)
    assert engine.peak_active >= 4, engine.peak_active


def test_sampling_is_per_request_in_one_batch(model: Any, engine: Engine) -> None:
    prompt = _prompts()[2]
    greedy = generate_alone(model, prompt, 16)
    with ThreadPoolExecutor(4) as pool:
        hot_sampling = Sampling(16, temperature=1.5)
        hot = [pool.submit(run_to_end, engine, prompt, hot_sampling) for _ in range(3)]
        cold = pool.submit(run_to_end, engine, prompt, Sampling(16))
        assert cold.result()[0] == greedy  # greedy beside sampled requests
        sampled = [f.result()[0] for f in hot]
    assert any(s != greedy for s in sampled), "temperature 1.5 drew the greedy tokens 3 times"


Stream = Generator[TokenStep, None, None]


def _started(engine: Engine, prompt: list[int], sampling: Sampling) -> tuple[Stream, list[int]]:
    """A request in the running batch, with the tokens of its first step."""
    stream = engine.generate(prompt, sampling)
    return stream, next(stream).token_ids


def _rest(stream: Stream, tokens: list[int]) -> list[int]:
    return tokens + [t for step in stream for t in step.token_ids]


def test_a_seed_gives_the_same_tokens_alone_and_in_a_busy_batch(model: Any, engine: Engine) -> None:
    prompt = _prompts()[1]
    seeded = Sampling(12, temperature=1.0, seed=1234)
    alone = run_to_end(engine, prompt, seeded)[0]
    assert run_to_end(engine, prompt, seeded)[0] == alone
    greedy_prompt = _prompts()[0]
    greedy_alone = generate_alone(model, greedy_prompt, 16)  # not while the engine runs the model

    # Eight requests, joining at different steps: the seeded one twice (once early,
    # once late), others with other prompts and seeds, one unseeded, one greedy.
    engine.peak_active = 0
    others = [
        _started(engine, p, Sampling(48, temperature=1.0, seed=i))
        for i, p in enumerate(_prompts()[2:5])
    ]
    early = _started(engine, prompt, seeded)
    others.append(_started(engine, _prompts()[5], Sampling(48, temperature=1.0)))
    greedy = _started(engine, greedy_prompt, Sampling(16, seed=5))
    early_tokens = early[1] + next(early[0]).token_ids + next(early[0]).token_ids
    late = _started(engine, prompt, seeded)
    others.append(_started(engine, [7, 8, 9], Sampling(48, temperature=1.0, seed=77)))

    assert _rest(early[0], early_tokens) == alone
    assert _rest(late[0], late[1]) == alone
    assert _rest(*greedy) == greedy_alone  # a seed leaves greedy exact
    for stream, tokens in others:
        assert _rest(stream, tokens)
    assert engine.peak_active >= 4, engine.peak_active


def test_two_seeds_give_different_tokens(engine: Engine) -> None:
    prompt = _prompts()[0]
    one = run_to_end(engine, prompt, Sampling(12, temperature=1.0, seed=1))[0]
    two = run_to_end(engine, prompt, Sampling(12, temperature=1.0, seed=2))[0]
    assert one != two


def test_an_unseeded_request_beside_a_seeded_one_changes_nothing(engine: Engine) -> None:
    prompt = _prompts()[2]
    seeded = Sampling(12, temperature=1.0, seed=99)
    alone = run_to_end(engine, prompt, seeded)[0]
    unseeded, first = _started(engine, prompt, Sampling(24, temperature=1.0))
    assert run_to_end(engine, prompt, seeded)[0] == alone  # beside an unseeded draw
    drawn = _rest(unseeded, first)
    assert drawn != run_to_end(engine, prompt, Sampling(24, temperature=1.0))[0], "no seed: random"


def test_leaving_a_stream_frees_its_sequence(engine: Engine) -> None:
    stream = engine.generate(_prompts()[3], Sampling(max_new_tokens=200))
    first = next(stream)
    assert first.token_ids and not first.finished
    assert engine.active_requests() >= 1
    stream.close()  # the caller went away
    deadline = 50
    while engine.active_requests() and deadline:
        threading.Event().wait(0.05)
        deadline -= 1
    assert engine.active_requests() == 0


def test_bad_requests_are_refused(engine: Engine) -> None:
    with pytest.raises(EngineError, match="no tokens"):
        next(engine.generate([], Sampling(4)))
    with pytest.raises(ValueError, match="max_new_tokens"):
        Sampling(0)
    with pytest.raises(ValueError, match="top_p"):
        Sampling(4, top_p=0)
    for seed in (-1, 2**63):
        with pytest.raises(ValueError, match="seed"):
            Sampling(4, seed=seed)
    assert Sampling(4, seed=2**63 - 1).processor_kwargs(VOCAB)["seed"] == 2**63 - 1
    assert "seed" not in Sampling(4).processor_kwargs(VOCAB)


def _one_engine(model: Any) -> Engine:
    """An engine of its own, for a test that breaks its generation loop."""
    sizes = EngineSizes(max_num_seqs=4, max_batch_tokens=128, kv_cache_bytes=1 << 20)
    return Engine(model, sizes, eos_token_ids=[EOS])


def _beside(engine: Engine, prompt: list[int], n: int) -> tuple[threading.Thread, list[Any]]:
    """A greedy request of ``n`` tokens running in a thread: its (tokens, reason) or
    its error lands in the list."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(run_to_end(engine, prompt, Sampling(max_new_tokens=n, ignore_eos=True)))
        except EngineError as exc:
            out.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def test_a_prompt_outside_the_vocabulary_is_refused_and_the_batch_goes_on(model: Any) -> None:
    """An id past the embeddings (or below 0) would fail the step that holds it, and
    transformers then fails every request in the batch and stops its loop."""
    engine = _one_engine(model)
    try:
        prompt = _prompts()[1]
        thread, out = _beside(engine, prompt, 60)
        while engine.active_requests() == 0:
            time.sleep(0.01)
        for bad, says in (([5, VOCAB], f"token id {VOCAB}"), ([-1, 5], "token id -1")):
            with pytest.raises(EngineError, match=says):
                next(engine.generate(bad, Sampling(4)))
        thread.join(timeout=60)
        assert out == [(generate_alone(model, prompt, 60), "length")]
        assert (engine.restarts, engine.dead) == (0, None)
    finally:
        engine.close()


def test_a_sequence_the_cache_cannot_hold_is_refused_and_the_batch_goes_on(model: Any) -> None:
    """Two 64-token blocks: a sequence holds at most 128 tokens (the last made is never
    fed back). Past that transformers could never schedule it, failed the whole batch
    ("No requests can be scheduled") and stopped its loop."""
    sizes = EngineSizes(max_num_seqs=4, max_batch_tokens=64, kv_cache_bytes=64 << 10)
    engine = Engine(model, sizes, eos_token_ids=[EOS])
    try:
        assert engine.sequence_tokens == 128
        prompt = _prompts()[0]
        thread, out = _beside(engine, prompt, 40)
        while engine.active_requests() == 0:
            time.sleep(0.01)
        with pytest.raises(
            EngineError, match="need 129 tokens of KV cache; one sequence may hold 128"
        ):
            next(engine.generate([5] * 100, Sampling(max_new_tokens=30)))
        thread.join(timeout=60)
        assert out == [(generate_alone(model, prompt, 40), "length")]
        full = Sampling(max_new_tokens=29, ignore_eos=True)
        assert len(run_to_end(engine, [5] * 100, full)[0]) == 29
        assert engine.restarts == 0
    finally:
        engine.close()


def test_an_offloaded_request_runs_on_when_the_active_one_is_cancelled(model: Any) -> None:
    """Four blocks, two requests of 250 tokens: at 128 tokens each needs a third block,
    so transformers offloads one and takes no waiting request until an active one
    finishes. The active one is cancelled there (its caller left) and none finishes:
    the offloaded one, and every request after it, waited forever."""
    sizes = EngineSizes(max_num_seqs=4, max_batch_tokens=256, kv_cache_bytes=128 << 10)
    engine = Engine(model, sizes, eos_token_ids=[EOS])
    try:
        g = torch.Generator().manual_seed(5)
        prompts = [torch.randint(3, VOCAB, (100,), generator=g).tolist() for _ in range(2)]
        tokens: dict[str, list[int]] = {"a": [], "b": []}
        ended = {"a": threading.Event(), "b": threading.Event()}
        offloaded = threading.Event()
        cancelled: list[str] = []

        def sink_for(name: str) -> Any:
            def sink(item: TokenStep | EngineError) -> None:
                if isinstance(item, TokenStep):
                    tokens[name] += item.token_ids
                if not isinstance(item, TokenStep) or item.finished:
                    ended[name].set()

            return sink

        def cancel_the_active_one() -> None:  # in the router, before another step
            scheduler = engine._manager.batch_processor.scheduler
            if scheduler.block_new_requests and not offloaded.is_set():
                offloaded.set()
                for request_id in list(scheduler.active_requests):
                    cancelled.append(request_id)
                    engine.cancel(request_id)

        engine.add_step_listener(cancel_the_active_one)
        sampling = Sampling(max_new_tokens=150, ignore_eos=True)
        for name, prompt in zip(("a", "b"), prompts, strict=True):
            engine.push(prompt, sampling, sink_for(name), name)
        assert offloaded.wait(30), "the cache never made the scheduler offload a request"
        assert len(cancelled) == 1, cancelled
        left, waited = cancelled[0], "b" if cancelled[0] == "a" else "a"
        assert ended[waited].wait(30), "the offloaded request never ran again"
        assert len(tokens[waited]) == 150 and len(tokens[left]) < 150
        alone = generate_alone(model, prompts[0 if waited == "a" else 1], 150)
        assert tokens[waited][: len(alone)] == alone  # generate stops at its end of text
        after = _prompts()[1]
        assert run_to_end(engine, after, Sampling(max_new_tokens=6))[0] == generate_alone(
            model, after, 6
        )
    finally:
        engine.close()


def test_a_tiny_temperature_is_taken_as_the_least_and_a_nan_is_refused(model: Any) -> None:
    """The manager keeps a request's temperature in float32: 1e-300 there is 0, its
    scores inf, its probabilities nan, and the step fails for the whole batch."""
    assert Sampling(4, temperature=1e-300).processor_kwargs(VOCAB)["temperature"] == 0.01
    for bad in (math.nan, math.inf):
        with pytest.raises(ValueError, match="temperature"):
            Sampling(4, temperature=bad)
    engine = _one_engine(model)
    try:
        prompt = _prompts()[1]
        thread, out = _beside(engine, prompt, 40)
        tokens, _ = run_to_end(engine, [5, 6, 7], Sampling(max_new_tokens=8, temperature=1e-300))
        assert tokens
        thread.join(timeout=60)
        assert out == [(generate_alone(model, prompt, 40), "length")]
        assert engine.restarts == 0
    finally:
        engine.close()


def test_a_failed_step_costs_its_batch_and_the_loop_starts_again(
    model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step that raises (a bug, memory) stops transformers' loop and fails the
    requests in it; the engine starts the loop again, so the next call is answered."""
    engine = _one_engine(model)
    try:
        forward = model.forward
        failing = {"left": 1}

        def fails_once(*args: Any, **kwargs: Any) -> Any:
            if failing["left"]:
                failing["left"] -= 1
                raise RuntimeError("a step went wrong")
            return forward(*args, **kwargs)

        monkeypatch.setattr(model, "forward", fails_once)
        with pytest.raises(EngineError, match="a step went wrong"):
            run_to_end(engine, [5, 6, 7], Sampling(max_new_tokens=8))
        prompt = _prompts()[2]
        assert run_to_end(engine, prompt, Sampling(max_new_tokens=6))[0] == generate_alone(
            model, prompt, 6
        )
        assert (engine.restarts, engine.dead) == (1, None)
    finally:
        engine.close()


def test_a_loop_that_cannot_start_again_refuses_calls_saying_why(
    model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = _one_engine(model)
    try:
        forward = model.forward

        def fails(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("the device is gone")

        monkeypatch.setattr(model, "forward", fails)
        with pytest.raises(EngineError, match="the device is gone"):
            run_to_end(engine, [5, 6, 7], Sampling(max_new_tokens=8))
        deadline = time.monotonic() + 30
        while engine.dead is None:
            assert time.monotonic() < deadline, "the engine never gave up"
            time.sleep(0.05)
        monkeypatch.setattr(model, "forward", forward)
        with pytest.raises(EngineDeadError, match=r"could not start again.*the device is gone"):
            run_to_end(engine, [5, 6], Sampling(max_new_tokens=2))
        assert issubclass(EngineDeadError, ReplicaLost)  # the replica exits after the call
        assert engine.restarts == 0
    finally:
        engine.close()


def test_ignore_eos_runs_past_the_end_of_text(model: Any) -> None:
    """The third greedy token made the end of text: a request stops there, one with
    ``ignore_eos`` runs on to max_new_tokens with the same tokens up to it."""
    prompt = _prompts()[1]
    greedy = generate_alone(model, prompt, 12)
    eos = greedy[2]
    sizes = EngineSizes(max_num_seqs=2, max_batch_tokens=128, kv_cache_bytes=1 << 20)
    engine = Engine(model, sizes, eos_token_ids=[eos])
    try:
        stopped, reason = run_to_end(engine, prompt, Sampling(max_new_tokens=12))
        assert (stopped, reason) == (greedy[: greedy.index(eos) + 1], "stop")
        ran_on, reason = run_to_end(engine, prompt, Sampling(max_new_tokens=12, ignore_eos=True))
        assert (len(ran_on), reason) == (12, "length")
        assert ran_on[: len(stopped)] == stopped
    finally:
        engine.close()


def test_a_reader_behind_the_batch_takes_the_steps_it_missed_as_one() -> None:
    steps: queue.Queue[Any] = queue.Queue()
    for step in (TokenStep([2], 2.0), TokenStep([3, 4], 3.0, "length")):
        steps.put(step)
    steps.put(TokenStep([9], 9.0))  # another request's would never be here; past the end
    joined, held = _with_waiting(TokenStep([1], 1.0, None, 0.5), steps)
    assert joined == TokenStep([1, 2, 3, 4], 3.0, "length", 0.5) and held is None
    assert steps.qsize() == 1  # nothing taken past the finish

    failure = RuntimeError("generation failed")
    steps = queue.Queue()
    steps.put(TokenStep([2], 2.0))
    steps.put(failure)
    joined, held = _with_waiting(TokenStep([1], 1.0), steps)
    assert joined == TokenStep([1, 2], 2.0) and held is failure
    assert _with_waiting(TokenStep([7], 7.0), queue.Queue()) == (TokenStep([7], 7.0), None)


def test_pushed_requests_get_the_same_tokens_and_a_listener_call_per_batch(model: Any) -> None:
    """``push``: the router hands each step to the request's sink and calls the step
    listeners after each batch of outputs; the tokens are ``generate``'s."""
    sizes = EngineSizes(max_num_seqs=4, max_batch_tokens=128, kv_cache_bytes=1 << 20)
    engine = Engine(model, sizes, eos_token_ids=[EOS])
    prompts = _prompts()[:3]
    steps: dict[str, list[TokenStep]] = {str(i): [] for i in range(len(prompts))}
    done = threading.Event()
    batches: list[int] = []  # steps handed over between two listener calls
    handed = 0

    def sink_for(key: str) -> Any:
        def sink(item: Any) -> None:
            nonlocal handed
            assert isinstance(item, TokenStep), item
            steps[key].append(item)
            handed += 1
            if all(s and s[-1].finished for s in steps.values()):
                done.set()

        return sink

    def listener() -> None:
        nonlocal handed
        batches.append(handed)
        handed = 0

    try:
        engine.add_step_listener(listener)
        expected = [run_to_end(engine, p, Sampling(max_new_tokens=10))[0] for p in prompts]
        batches.clear()
        for i, prompt in enumerate(prompts):
            engine.push(prompt, Sampling(max_new_tokens=10), sink_for(str(i)), f"r{i}")
        assert done.wait(30)
        got = [[t for s in steps[str(i)] for t in s.token_ids] for i in range(len(prompts))]
        assert got == expected
        assert sum(batches) == sum(len(s) for s in steps.values())
        assert max(batches) > 1  # the three requests' steps came in shared batches
        assert engine.active_requests() == 0
    finally:
        engine.close()


def test_closing_the_engine_ends_a_pushed_request_and_tells_the_listeners(model: Any) -> None:
    sizes = EngineSizes(max_num_seqs=2, max_batch_tokens=128, kv_cache_bytes=1 << 20)
    engine = Engine(model, sizes, eos_token_ids=[EOS])
    got: list[Any] = []
    flushed = threading.Event()
    first = threading.Event()

    def sink(item: Any) -> None:
        got.append(item)
        first.set()

    engine.add_step_listener(flushed.set)
    engine.push(_prompts()[0], Sampling(max_new_tokens=200, ignore_eos=True), sink, "long")
    assert first.wait(30)
    flushed.clear()
    engine.close()
    assert isinstance(got[-1], EngineError) and "stopped" in str(got[-1])
    assert flushed.is_set()  # the error's frames go out, though the router has stopped
    with pytest.raises(EngineError, match="stopped"):
        engine.push(_prompts()[0], Sampling(max_new_tokens=2), sink, "late")


def test_a_cancelled_pushed_request_gets_nothing_more(model: Any) -> None:
    sizes = EngineSizes(max_num_seqs=2, max_batch_tokens=128, kv_cache_bytes=1 << 20)
    engine = Engine(model, sizes, eos_token_ids=[EOS])
    got: list[Any] = []
    first = threading.Event()

    def sink(item: Any) -> None:
        got.append(item)
        first.set()

    try:
        engine.push(_prompts()[1], Sampling(max_new_tokens=200, ignore_eos=True), sink, "c")
        assert first.wait(30)
        engine.cancel("c")
        n = len(got)
        deadline = time.monotonic() + 5
        while engine.active_requests():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert len(got) <= n + 1 and engine.aborted == 1  # at most the one being handed over
        assert not any(isinstance(s, TokenStep) and s.finished for s in got)
    finally:
        engine.close()


def test_steps_run_eagerly_off_a_gpu_whatever_the_setting(model: Any, engine: Engine) -> None:
    assert engine.sizes.cuda_graphs and not engine.cuda_graphs  # the CPU has no graphs


def test_a_model_that_fails_the_graph_probe_runs_eagerly_and_answers(
    model: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Where graphs are tried (``can_graph``: a CUDA device), the start's probe request
    fails on a model whose forward cannot be captured; the engine then starts again
    eagerly. Here graphs are tried on the CPU, where transformers runs the steps eagerly
    anyway, and the model's forward fails, as a capture would, while they are asked for."""
    import worker.llm.engine as engine_module

    monkeypatch.setattr(engine_module, "can_graph", lambda m: True)
    configs: list[Any] = []  # what each manager was asked for, the latest last
    init = model.init_continuous_batching

    def recorded(**kwargs: Any) -> Any:
        configs.append(kwargs["continuous_batching_config"])
        return init(**kwargs)

    monkeypatch.setattr(model, "init_continuous_batching", recorded)
    failed: list[int] = []

    def fail_under_graphs(module: Any, args: Any) -> None:
        if configs[-1].use_cuda_graph:
            failed.append(1)
            raise RuntimeError("operation not permitted when stream is capturing")

    hook = model.model.layers[0].register_forward_pre_hook(fail_under_graphs)
    sizes = EngineSizes(max_num_seqs=4, max_batch_tokens=128, kv_cache_bytes=1 << 20)
    try:
        with caplog.at_level("WARNING", logger="worker.llm.engine"):
            engine = Engine(model, sizes, eos_token_ids=[EOS])
    finally:
        hook.remove()
    try:
        assert failed and len(configs) == 2  # the probe ran into it; then an eager start
        assert not engine.cuda_graphs and configs[-1].use_cuda_graph is False
        assert "cannot run as CUDA graphs" in caplog.text and "stream is capturing" in caplog.text
        prompt = _prompts()[2]
        tokens, _ = run_to_end(engine, prompt, Sampling(max_new_tokens=12))
        assert tokens == generate_alone(model, prompt, 12)
    finally:
        engine.close()


@pytest.mark.parametrize("architecture", ["gpt_neox", "opt"])
def test_a_model_that_cannot_batch_is_refused_at_start_naming_it(architecture: str) -> None:
    """GPT-NeoX's and OPT's layers (transformers 5) call the KV cache in ways the paged
    cache does not take: every step fails. The start's probe finds it, so the engine is
    refused with the model named, not a caller's request with the library's error."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, OPTConfig, OPTForCausalLM

    torch.manual_seed(0)
    if architecture == "gpt_neox":
        model = GPTNeoXForCausalLM(
            GPTNeoXConfig(
                vocab_size=VOCAB,
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=1,
                num_attention_heads=2,
            )
        )
        name = "GPTNeoXForCausalLM ('gpt_neox')"
    else:
        model = OPTForCausalLM(
            OPTConfig(
                vocab_size=VOCAB,
                hidden_size=32,
                ffn_dim=64,
                num_hidden_layers=1,
                num_attention_heads=2,
                word_embed_proj_dim=32,
            )
        )
        name = "OPTForCausalLM ('opt')"
    model.eval().config._attn_implementation = "sdpa"
    sizes = EngineSizes(max_num_seqs=4, max_batch_tokens=64, kv_cache_bytes=1 << 20)
    threads_before = {t.name for t in threading.enumerate()}
    with pytest.raises(EngineError) as refused:
        Engine(model, sizes, eos_token_ids=[EOS])
    assert str(refused.value).startswith(
        f"{name} cannot run on transformers' continuous batching: "
    )
    time.sleep(0.2)
    assert {t.name for t in threading.enumerate()} <= threads_before  # its loop was stopped


def test_a_model_that_passes_the_graph_probe_keeps_its_graphs(
    model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import worker.llm.engine as engine_module

    monkeypatch.setattr(engine_module, "can_graph", lambda m: True)
    sizes = EngineSizes(max_num_seqs=4, max_batch_tokens=128, kv_cache_bytes=1 << 20)
    engine = Engine(model, sizes, eos_token_ids=[EOS])
    try:
        assert engine.cuda_graphs
        config = engine._manager.continuous_batching_config
        assert config.q_padding_interval_size == engine_module.GRAPH_Q_TOKENS
        assert config.kv_padding_interval_size == engine_module.GRAPH_KV_TOKENS  # a small cache
        assert not config.use_async_batching
        prompt = _prompts()[3]
        assert run_to_end(engine, prompt, Sampling(max_new_tokens=8))[0] == generate_alone(
            model, prompt, 8
        )
    finally:
        engine.close()


def test_the_capture_gate_lets_a_shape_through_when_it_comes_again() -> None:
    gate = CaptureGate()
    assert [gate.capture((16, 256, 1024)) for _ in range(3)] == [False, True, True]
    assert gate.capture((32, 256, 1024)) is False
    assert (gate.captures, gate.eager_steps) == (2, 2)
    assert all(CaptureGate(capture_at=1).capture((16, k)) for k in range(3))
    with pytest.raises(ValueError, match="capture_at must be at least 1"):
        CaptureGate(capture_at=0)


def test_after_the_probe_a_new_shape_runs_eagerly_and_its_second_step_is_let_through(
    model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Graphs tried on the CPU (where transformers runs every step eagerly): the gate sits
    in the step's path once the probe has run. A request's shapes are new the first time
    (held back), and let through when the same request comes again."""
    import worker.llm.engine as engine_module

    monkeypatch.setattr(engine_module, "can_graph", lambda m: True)
    sizes = EngineSizes(max_num_seqs=4, max_batch_tokens=128, kv_cache_bytes=1 << 20)
    engine = Engine(model, sizes, eos_token_ids=[EOS])
    try:
        gate = engine.capture_gate
        assert gate is not None and (gate.captures, gate.eager_steps) == (0, 0)
        prompt = _prompts()[1]
        want = generate_alone(model, prompt, 6)
        assert run_to_end(engine, prompt, Sampling(max_new_tokens=6))[0] == want
        held = gate.eager_steps
        assert held > 0 and gate.captures == 0
        assert run_to_end(engine, prompt, Sampling(max_new_tokens=6))[0] == want
        assert gate.eager_steps == held and gate.captures > 0
    finally:
        engine.close()


def test_a_step_held_back_runs_with_the_runners_graphs_off_and_on_again_after(
    model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner's graphs are turned on here, on the CPU, where a capture cannot run:
    every step is held back (the gate never lets one through), so each must run with
    them off, and they are on again between steps."""
    import worker.llm.engine as engine_module

    monkeypatch.setattr(engine_module, "can_graph", lambda m: True)
    sizes = EngineSizes(max_num_seqs=4, max_batch_tokens=128, kv_cache_bytes=1 << 20)
    engine = Engine(model, sizes, eos_token_ids=[EOS], capture_at=10**9)
    try:
        runner = engine._manager.batch_processor.model_runner
        seen: list[tuple[bool, bool]] = []
        forward = runner._forward_process_and_sample

        def recorded(*args: Any) -> None:
            seen.append((runner.use_cuda_graph_varlen, runner.use_cuda_graph_decode))
            forward(*args)

        runner._forward_process_and_sample = recorded
        runner.use_cuda_graph_varlen = runner.use_cuda_graph_decode = True
        prompt = _prompts()[0]
        tokens, _ = run_to_end(engine, prompt, Sampling(max_new_tokens=5))
        assert tokens == generate_alone(model, prompt, 5)
        assert seen and set(seen) == {(False, False)}
        assert (runner.use_cuda_graph_varlen, runner.use_cuda_graph_decode) == (True, True)
    finally:
        engine.close()
