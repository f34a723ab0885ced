"""Incremental detokenization with a byte-level BPE tokenizer trained here: tokens
that end inside a UTF-8 character never show U+FFFD, and the deltas joined equal
the text of all the ids decoded at once; each token's own text and bytes (as logprobs
name tokens) join to the text, a cut character's byte and a sentencepiece space kept."""

from __future__ import annotations

from typing import Any

import pytest

from examples.build_model import build_tokenizer
from worker.llm.detokenize import (
    LOGPROB_FLOOR,
    REPLACEMENT_CHAR,
    IncrementalDetokenizer,
    TokenTexts,
)
from worker.llm.logprobs import TokenLogprob

TEXTS = [
    "The quick brown fox",
    "héllo wörld — naïve café",
    "日本語のテキスト 🙂🚀 emoji",
    "mixed: Ελληνικά, русский, العربية!",
]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tokenizer()


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("step", [1, 2, 3])
def test_deltas_join_to_the_whole_text(tokenizer: Any, text: str, step: int) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    whole = tokenizer.decode(ids, skip_special_tokens=True)
    detok = IncrementalDetokenizer(tokenizer)
    deltas = [detok.add(ids[i : i + step]) for i in range(0, len(ids), step)]
    deltas.append(detok.finish())
    assert "".join(deltas) == whole == text
    assert not any(REPLACEMENT_CHAR in d for d in deltas)


def test_a_cut_character_is_held_back_until_it_is_whole(tokenizer: Any) -> None:
    ids = tokenizer.encode("🙂", add_special_tokens=False)
    assert len(ids) > 1, "the tokenizer should split this emoji into bytes"
    detok = IncrementalDetokenizer(tokenizer)
    assert [detok.add([i]) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert detok.add(ids[-1:]) == "🙂"
    assert detok.finish() == ""


def test_a_stream_cut_mid_character_ends_as_decode_gives_it(tokenizer: Any) -> None:
    ids = tokenizer.encode("ok 🙂", add_special_tokens=False)[:-1]
    detok = IncrementalDetokenizer(tokenizer)
    shown = "".join(detok.add([i]) for i in ids) + detok.finish()
    assert shown == tokenizer.decode(ids, skip_special_tokens=True)


def llama_style_tokenizer() -> Any:
    """A sentencepiece-style tokenizer as Llama 2's and Mistral's ``tokenizer.json``
    have it (▁ for spaces, byte fallback, a decoder that strips the text's first
    space), trained here on the example's sentences."""
    import json

    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from examples.build_model import SENTENCES

    base = Tokenizer(models.BPE(unk_token="<unk>"))
    base.normalizer = normalizers.Sequence(
        [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
    )
    base.pre_tokenizer = pre_tokenizers.Split("▁", "merged_with_next")
    special = ["<unk>", "<s>", "</s>"]
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=special, show_progress=False)
    base.train_from_iterator(SENTENCES, trainer)
    vocab = base.get_vocab()
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    merges = [tuple(m) for m in json.loads(base.to_str())["model"]["merges"]]
    tok = Tokenizer(
        models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True)
    )
    tok.normalizer, tok.pre_tokenizer = base.normalizer, base.pre_tokenizer
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    tok.add_special_tokens(special)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")


@pytest.mark.parametrize("step", [1, 3])
def test_a_completion_continues_its_prompt_with_a_sentencepiece_tokenizer(step: int) -> None:
    """Decoded alone, "▁a ▁time" is "a time" (the decoder strips the first space):
    after "Once upon" the completion is " a time", as the prompt's continuation."""
    tokenizer = llama_style_tokenizer()
    prompt = tokenizer.encode("Once upon", add_special_tokens=False)
    whole = tokenizer.encode("Once upon a time 🙂 café", add_special_tokens=False)
    assert whole[: len(prompt)] == prompt
    completion = whole[len(prompt) :]
    assert tokenizer.decode(completion) == "a time 🙂 café"  # the space lost alone
    detok = IncrementalDetokenizer(tokenizer, prompt_ids=prompt)
    deltas = [detok.add(completion[i : i + step]) for i in range(0, len(completion), step)]
    deltas.append(detok.finish())
    assert "".join(deltas) == " a time 🙂 café"
    assert not any(REPLACEMENT_CHAR in d for d in deltas)


@pytest.mark.parametrize("seed", range(4))
def test_any_ids_join_to_decode_of_them_all(tokenizer: Any, seed: int) -> None:
    """Random ids of the byte-level vocabulary (cut and broken characters, special
    tokens), a window of ids at a time: the deltas and the end are decode's text."""
    import random

    draw = random.Random(seed)
    ids = [draw.randrange(len(tokenizer)) for _ in range(300)]
    detok = IncrementalDetokenizer(tokenizer)
    shown, i = "", 0
    while i < len(ids):
        n = draw.randint(1, 4)
        shown += detok.add(ids[i : i + n])
        i += n
    shown += detok.finish()
    assert shown == tokenizer.decode(ids, skip_special_tokens=True)


class _SlowTokenizer:
    """A tokenizer with no ``tokenizers`` backend (a Python one): only ``decode``."""

    def __init__(self, fast: Any) -> None:
        self._fast = fast

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return str(self._fast.decode(token_ids, skip_special_tokens=skip_special_tokens))


def test_a_slow_tokenizer_decodes_the_whole_completion(tokenizer: Any) -> None:
    ids = tokenizer.encode("日本語 🙂 ok", add_special_tokens=False)
    detok = IncrementalDetokenizer(_SlowTokenizer(tokenizer), prompt_ids=[5, 6])
    shown = "".join(detok.add([i]) for i in ids[:-1]) + detok.add(ids[-1:]) + detok.finish()
    assert shown == "日本語 🙂 ok"


# --- each token's own text and bytes (logprobs) ------------------------------------


@pytest.mark.parametrize("text", TEXTS)
def test_each_tokens_bytes_join_to_the_text_with_a_byte_level_tokenizer(
    tokenizer: Any, text: str
) -> None:
    texts = TokenTexts(tokenizer)
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert bytes(b for i in ids for b in texts.text(i)[1]) == text.encode()
    for i in ids:
        token, raw = texts.text(i)
        assert token == bytes(raw).decode("utf-8", errors="replace")


def test_a_token_cut_inside_a_character_has_its_own_byte_and_says_so(tokenizer: Any) -> None:
    ids = tokenizer.encode("🙂", add_special_tokens=False)
    assert len(ids) > 1  # the emoji's 4 bytes are more than one token here
    first, raw = TokenTexts(tokenizer).text(ids[0])
    assert REPLACEMENT_CHAR in first and raw == list("🙂".encode()[: len(raw)])


def test_a_sentencepiece_token_keeps_its_space_and_byte_fallback_its_byte() -> None:
    tokenizer = llama_style_tokenizer()
    texts = TokenTexts(tokenizer)
    text = "the fox jumps 🙂"
    ids = tokenizer.encode(text, add_special_tokens=False)
    joined = bytes(b for i in ids for b in texts.text(i)[1])
    assert joined == (" " + text).encode()  # sentencepiece's leading ▁ is a space
    spaced = [texts.text(i)[0] for i in ids if texts.text(i)[0].startswith(" ")]
    assert len(spaced) >= 3, "a word's token lost its leading space"


def test_special_tokens_are_named_as_they_are_written(tokenizer: Any) -> None:
    eos = tokenizer.eos_token_id
    assert TokenTexts(tokenizer).text(eos) == (
        tokenizer.eos_token,
        list(tokenizer.eos_token.encode()),
    )


def test_entries_are_openais_chat_shape_with_minus_infinity_floored(tokenizer: Any) -> None:
    ids = tokenizer.encode("fox", add_special_tokens=False)
    made = [TokenLogprob(ids[0], -0.25, ((ids[0], -0.25), (3, float("-inf"))))]
    [entry] = TokenTexts(tokenizer).entries(made)
    assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
    assert entry["logprob"] == -0.25 and len(entry["top_logprobs"]) == 2
    assert entry["top_logprobs"][1]["logprob"] == LOGPROB_FLOOR
    assert set(entry["top_logprobs"][0]) == {"token", "logprob", "bytes"}
