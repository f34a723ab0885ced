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
