"""Incremental detokenization: text deltas from token ids as they come.

A byte-level tokenizer can end a token inside a UTF-8 character; decoding such
a prefix gives U+FFFD where the rest of the character is still to come. A delta
is held back until the text decodes whole again, so the deltas joined equal
``decode(all ids)`` exactly, and ``finish`` gives what is left at the end.

The text is decoded from the first id each time: byte-level decoding is not
prefix-stable at a window's edge, and a completion's few hundred ids decode in
microseconds beside a model step.
"""

from __future__ import annotations

from typing import Protocol

REPLACEMENT_CHAR = "\ufffd"


class Decoder(Protocol):
    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str: ...


class IncrementalDetokenizer:
    """Feed ids with ``add``; each returns the new text that is safe to show."""

    def __init__(self, tokenizer: Decoder, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self.token_ids: list[int] = []
        self.emitted = ""

    def _text(self) -> str:
        return self._tokenizer.decode(self.token_ids, skip_special_tokens=self._skip_special)

    def add(self, new_ids: list[int]) -> str:
        """The text ``new_ids`` completes: empty while a character is cut, or while
        the text so far does not extend what was already shown."""
        self.token_ids.extend(new_ids)
        text = self._text()
        if text.endswith(REPLACEMENT_CHAR) or not text.startswith(self.emitted):
            return ""
        delta = text[len(self.emitted) :]
        self.emitted = text
        return delta

    def finish(self) -> str:
        """The rest of the text once no id will come (a cut character stays U+FFFD,
        as ``decode`` gives it)."""
        text = self._text()
        if not text.startswith(self.emitted):
            # Never seen with byte-level or sentencepiece tokenizers; if a decoder
            # rewrote shown text, the tail is what can still be given.
            return text[len(self.emitted) :] if len(text) > len(self.emitted) else ""
        delta = text[len(self.emitted) :]
        self.emitted = text
        return delta
