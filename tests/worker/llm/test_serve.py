"""An LLM replica built from a thaw Context, as a replica's setup builds it: the
example's tiny Llama and its byte-level tokenizer (made here, with a chat
template), weights from safetensors files. Greedy text equals ``generate`` decoded;
stop strings end the text; a prompt past the context is refused."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from control_plane.protocol import LLMOptions
from examples.build_model import build_model
from snapshotter.loader import LoadedTensors
from worker.llm.engine import Sampling
from worker.llm.serve import LLMReplica, LLMRequestError, PromptTooLongError, sampling_defaults
from worker.sdk import Context

TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant:{% endif %}"
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import AutoTokenizer

    path = build_model(tmp_path_factory.mktemp("llm") / "model")
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def replica(model_dir: Path) -> Iterator[LLMReplica]:
    r = _replica(model_dir, LLMOptions(max_num_seqs=4, kv_cache_mb=2))
    yield r
    r.close()


def _replica(model_dir: Path, options: LLMOptions) -> LLMReplica:
    weights = LoadedTensors()
    for shard in sorted(model_dir.glob("*.safetensors")):
        weights.update(load_file(shard))
    weights.report = None  # type: ignore[assignment]  # read from files, not the store
    config = json.loads((model_dir / "config.json").read_text())
    ctx = Context(device="cpu", weights=weights, config=config, files=model_dir)
    return LLMReplica(ctx, options)


def _text(replica: LLMReplica, ids: list[int], sampling: Sampling, stop: Any = None) -> Any:
    deltas = list(replica.stream(ids, sampling, stop))
    return "".join(d.text for d in deltas), deltas[-1].finish_reason, sum(d.tokens for d in deltas)


def test_greedy_text_equals_generate_decoded(model_dir: Path, replica: LLMReplica) -> None:
    from transformers import AutoModelForCausalLM

    ids = replica.text_prompt("The quick brown fox")
    text, reason, tokens = _text(replica, ids, Sampling(max_new_tokens=20))
    reference = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    with torch.no_grad():
        out = reference.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=20)
    new = out[0, len(ids) :].tolist()
    assert text == replica.tokenizer.decode(new, skip_special_tokens=True)
    assert tokens == len(new)
    assert reason == ("stop" if new[-1] == replica.tokenizer.eos_token_id else "length")


def test_the_end_of_turn_in_generation_config_ends_the_text_as_generate_does(
    model_dir: Path, replica: LLMReplica, tmp_path: Path
) -> None:
    """A chat model names its end of turn in generation_config.json, beside the
    config's end of text (Llama 3, Gemma): the replica stops there, as generate."""
    import shutil

    from transformers import AutoModelForCausalLM

    ids = replica.text_prompt("The quick brown fox")
    turn_end = next(
        t for t in _generated(model_dir, ids, 12)[3:] if t != replica.tokenizer.eos_token_id
    )
    chat_dir = tmp_path / "chat-model"
    shutil.copytree(model_dir, chat_dir)
    generation = json.loads((chat_dir / "generation_config.json").read_text())
    generation["eos_token_id"] = [replica.tokenizer.eos_token_id, turn_end]
    (chat_dir / "generation_config.json").write_text(json.dumps(generation))
    chat = _replica(chat_dir, LLMOptions(max_num_seqs=2, kv_cache_mb=1))
    try:
        reference = AutoModelForCausalLM.from_pretrained(chat_dir).eval()
        with torch.no_grad():
            out = reference.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=12)
        expected = out[0, len(ids) :].tolist()
        assert expected[-1] == turn_end and len(expected) < 12  # generate stopped there
        text, reason, tokens = _text(chat, ids, Sampling(max_new_tokens=12))
        assert (tokens, reason) == (len(expected), "stop")
        assert text == chat.tokenizer.decode(expected, skip_special_tokens=True)
    finally:
        chat.close()


def _generated(model_dir: Path, ids: list[int], n: int) -> list[int]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n)
    return list(out[0, len(ids) :].tolist())


def test_a_chat_prompt_uses_the_model_template(replica: LLMReplica) -> None:
    ids = replica.chat_prompt([{"role": "user", "content": "Hello"}])
    assert replica.tokenizer.decode(ids) == "<s>user: Hello\n<s>assistant:"
    text, reason, _ = _text(replica, ids, Sampling(max_new_tokens=8))
    assert reason in ("stop", "length") and isinstance(text, str)


def test_a_template_that_refuses_the_messages_or_none_is_a_request_error(
    replica: LLMReplica, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Gemma's template raises on a system message, many on roles out of turn: the
    caller's mistake (a 400), not the model failing (a 500)."""
    no_system = (
        "{% if messages[0]['role'] == 'system' %}"
        "{{ raise_exception('System role not supported') }}{% endif %}"
        "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    )
    monkeypatch.setattr(replica.tokenizer, "chat_template", no_system)
    system = [{"role": "system", "content": "Be brief"}, {"role": "user", "content": "Hi"}]
    with pytest.raises(LLMRequestError, match="refused the messages: System role not supported"):
        replica.chat_prompt(system)
    assert replica.chat_prompt(system[1:])
    monkeypatch.setattr(replica.tokenizer, "chat_template", None)
    with pytest.raises(LLMRequestError, match="no chat template"):
        replica.chat_prompt(system[1:])


def test_a_stop_string_ends_the_text_before_it(replica: LLMReplica) -> None:
    ids = replica.text_prompt("Hello, world!")
    full, _, _ = _text(replica, ids, Sampling(max_new_tokens=30))
    assert len(full) > 4, full
    stop = full[3:5]
    text, reason, _ = _text(replica, ids, Sampling(max_new_tokens=30), [stop])
    assert (text, reason) == (full[: full.index(stop)], "stop")


def test_a_sequence_past_the_kv_cache_is_refused_and_a_default_fits_it(model_dir: Path) -> None:
    """A context longer than the cache holds (a 32k model on a small kv_cache_mb): a
    sequence the cache cannot hold is refused naming the setting, never sent to fail
    the batch; with no max_tokens the call makes what fits."""
    r = _replica(model_dir, LLMOptions(max_num_seqs=2, kv_cache_mb=1, context_length=4096))
    try:
        held = r.engine.sequence_tokens
        assert held == 2048  # 1 MiB of 512-byte tokens (2 layers, 2 KV heads of 16, fp32)
        assert r.max_new_tokens([1] * 10, None) == held - 9
        assert r.max_new_tokens([1] * 10, held - 9) == held - 9
        with pytest.raises(PromptTooLongError, match=r"need 2049 tokens of KV cache.*= 1\)"):
            r.max_new_tokens([1] * 10, held - 8)
        with pytest.raises(PromptTooLongError, match="the prompt is 2049 tokens; this function"):
            r.max_new_tokens([1] * (held + 1), None)
        assert r.max_new_tokens([1] * held, None) == 1
    finally:
        r.close()


def test_prompt_past_the_context_is_refused(replica: LLMReplica) -> None:
    assert replica.max_new_tokens([1] * 10, None) == replica.context_length - 10
    with pytest.raises(PromptTooLongError, match="context of 256 tokens"):
        replica.max_new_tokens([1] * 10, 250)
    with pytest.raises(PromptTooLongError, match="this model's context is 256"):
        replica.max_new_tokens([1] * 256, None)


@pytest.mark.parametrize("top_k", [float("inf"), float("nan"), 2.5, -1])
def test_a_top_k_in_generation_config_no_call_could_sample_with_is_named(top_k: float) -> None:
    # json.loads takes Infinity and NaN: int() of them raised an error that named nothing.
    with pytest.raises(ValueError, match=r"generation_config.json has top_k = .* \(an integer"):
        sampling_defaults({"top_k": top_k})


def test_the_models_repetition_penalty_and_min_p_are_its_calls_defaults() -> None:
    defaults = sampling_defaults({"repetition_penalty": 1.05, "min_p": None, "temperature": 0.7})
    assert defaults["repetition_penalty"] == 1.05 and defaults["min_p"] == 0.0
    with pytest.raises(ValueError, match=r"repetition_penalty = 0 \(a number > 0\)"):
        sampling_defaults({"repetition_penalty": 0})
    with pytest.raises(ValueError, match=r"min_p = 1.5 \(in \[0, 1\]\)"):
        sampling_defaults({"min_p": 1.5})
