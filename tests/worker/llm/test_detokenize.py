"""Incremental detokenization with a byte-level BPE tokenizer trained here: tokens
that end inside a UTF-8 character never show U+FFFD, and the deltas joined equal
the text of all the ids decoded at once."""

from __future__ import annotations

from typing import Any

import pytest

from examples.build_model import build_tokenizer
from worker.llm.detokenize import REPLACEMENT_CHAR, IncrementalDetokenizer

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
