"""Incremental detokenization: text deltas from token ids as they come.

A fast tokenizer (``tokenizers``' backend, what ``AutoTokenizer`` gives for nearly
every model) is read through the library's own ``DecodeStream``, as vLLM does: each
id decodes a window of the last few ids, not the whole completion again (for a
4,096-token completion, the whole text once a token cost 1.3 s of the replica's CPU
against a few ms). The stream is primed with the prompt's last ids, so the first
token's text is the prompt's continuation: a sentencepiece tokenizer (Llama 2,
Mistral) strips the leading space of the first token it decodes, and the completion
"▁a ▁time" after "Once upon" is " a time", not "a time".

A byte-level tokenizer can end a token inside a UTF-8 character; decoding such a
prefix gives U+FFFD where the rest of the character is still to come. A delta is held
back until the text decodes whole again, and ``finish`` gives what is left at the end
(a cut character stays U+FFFD, as ``decode`` gives it). A slow tokenizer decodes the
whole completion each time, with no prompt context.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any, Protocol

REPLACEMENT_CHAR = "\ufffd"
# How far back into the prompt the stream is primed: from the nearest of these many
# ids whose text decodes whole (vLLM's bounds).
_PRIME_MIN_IDS = 4
_PRIME_MAX_IDS = 24

log = logging.getLogger(__name__)


class Decoder(Protocol):
    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str: ...


class IncrementalDetokenizer:
    """Feed ids with ``add``; each returns the new text that is safe to show."""

    def __init__(
        self,
        tokenizer: Decoder,
        skip_special_tokens: bool = True,
        prompt_ids: list[int] | None = None,
    ) -> None:
        from tokenizers import Tokenizer

        backend = getattr(tokenizer, "backend_tokenizer", None)  # a fast tokenizer's
        self._way: _Stream | _WholeDecode
        if isinstance(backend, Tokenizer):
            self._way = _Stream(backend, skip_special_tokens, prompt_ids or [])
        else:
            self._way = _WholeDecode(tokenizer, skip_special_tokens)

    def add(self, new_ids: list[int]) -> str:
        """The text ``new_ids`` completes: empty while a character is cut."""
        return self._way.add(new_ids)

    def finish(self) -> str:
        """The rest of the text once no id will come."""
        return self._way.finish()


class _WholeDecode:
    """A slow tokenizer's way: the whole completion decoded at each id."""

    def __init__(self, tokenizer: Decoder, skip_special: bool) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special
        self._ids: list[int] = []
        self._shown = ""

    def _text(self) -> str:
        return self._tokenizer.decode(self._ids, skip_special_tokens=self._skip_special)

    def add(self, new_ids: list[int]) -> str:
        self._ids.extend(new_ids)
        text = self._text()
        if text.endswith(REPLACEMENT_CHAR) or not text.startswith(self._shown):
            return ""
        delta, self._shown = text[len(self._shown) :], text
        return delta

    def finish(self) -> str:
        text = self._text()
        delta = text[len(self._shown) :] if text.startswith(self._shown) else ""
        self._shown += delta
        return delta


class _Stream:
    """``tokenizers.decoders.DecodeStream`` over a fast tokenizer's backend, primed
    with the prompt's tail; ids not yet shown are kept for ``finish``."""

    def __init__(self, backend: Any, skip_special: bool, prompt_ids: list[int]) -> None:
        self._backend = backend
        self._skip_special = skip_special
        self._stream = self._new()
        self._shown_ids = self._prime(prompt_ids)  # the ids of the text shown last
        self._held: list[int] = []  # ids whose text is not shown yet (a cut character)

    def _new(self) -> Any:
        from tokenizers.decoders import DecodeStream

        return DecodeStream(skip_special_tokens=self._skip_special)

    def _decode(self, ids: list[int]) -> str:
        return str(self._backend.decode(ids, skip_special_tokens=self._skip_special))

    def _prime(self, prompt_ids: list[int]) -> list[int]:
        tail = prompt_ids
        if len(prompt_ids) > _PRIME_MIN_IDS:
            for n in range(_PRIME_MIN_IDS, min(len(prompt_ids), _PRIME_MAX_IDS) + 1):
                if REPLACEMENT_CHAR not in self._decode(prompt_ids[-n:]):
                    tail = prompt_ids[-n:]
                    break
            else:
                tail = prompt_ids[-_PRIME_MAX_IDS:]
        for token_id in tail:
            self._step(token_id)
        return list(tail)

    def _step(self, token_id: int) -> str | None:
        try:
            return self._stream.step(self._backend, token_id)
        except Exception as exc:
            # tokenizers raises on a prefix its own decode later rewrote (seen with odd
            # byte sequences, as vLLM notes); the stream starts again from this id.
            if "Invalid prefix" not in str(exc):
                raise
            log.warning("detokenizing: %s; the decode stream starts again", exc)
            self._stream = self._new()
            return self._stream.step(self._backend, token_id)

    def add(self, new_ids: list[int]) -> str:
        pieces = []
        for token_id in new_ids:
            self._held.append(token_id)
            piece = self._step(token_id)
            if piece is not None:
                pieces.append(piece)
                self._shown_ids, self._held = self._shown_ids[-_PRIME_MIN_IDS:] + self._held, []
        return "".join(pieces)

    def finish(self) -> str:
        """What the held ids give after the text shown (a cut character: U+FFFD)."""
        if not self._held:
            return ""
        before = self._decode(self._shown_ids)
        after = self._decode(self._shown_ids + self._held)
        self._held = []
        return after[len(before) :] if after.startswith(before) else after


#: What a log probability of -inf (a token the model rules out) is sent as: JSON has
#: no infinity (vLLM sends the same).
LOGPROB_FLOOR = -9999.0


class TokenTexts:
    """Each token id's own text and bytes, as logprobs name tokens (OpenAI's ``token``
    and ``bytes``). Where the tokenizer's kind says what bytes a token stands for
    (byte-level BPE, GPT-2's table; sentencepiece's ▁ for a space and ``<0xNN>`` byte
    fallback) they are the token's own, and its text is them decoded: a token that ends
    inside a UTF-8 character has U+FFFD in its text and its true bytes, which a client
    joins whole, and a sentencepiece token keeps its leading space (decoding the id
    alone strips it). Special tokens, and tokenizers of another kind: the id decoded
    alone. Cached per id: a token's text never changes."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}
        self._kind = _piece_kind(tokenizer)
        added = getattr(tokenizer, "added_tokens_decoder", None) or {}
        self._added = {int(i): str(t) for i, t in added.items()}

    def text(self, token_id: int) -> tuple[str, list[int]]:
        known = self._cache.get(token_id)
        if known is None:
            known = self._text(token_id)
            self._cache[token_id] = known
        return known

    def _text(self, token_id: int) -> tuple[str, list[int]]:
        raw = None
        if token_id not in self._added and self._kind is not None:
            piece = self._tokenizer.convert_ids_to_tokens(token_id)
            raw = _piece_bytes(str(piece), self._kind) if piece is not None else None
        if raw is not None:
            return bytes(raw).decode("utf-8", errors="replace"), raw
        text = self._added.get(token_id)
        if text is None:
            text = str(self._tokenizer.decode([token_id], skip_special_tokens=False))
        return text, list(text.encode("utf-8", errors="replace"))

    def entries(self, logprobs: Any) -> list[dict[str, Any]]:
        """``worker.llm.logprobs.TokenLogprob``s as OpenAI's chat ``logprobs.content``."""
        out = []
        for made in logprobs:
            entry = self._entry(made.token_id, made.logprob)
            entry["top_logprobs"] = [self._entry(t, lp) for t, lp in made.top]
            out.append(entry)
        return out

    def _entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        text, raw = self.text(token_id)
        return {"token": text, "logprob": max(logprob, LOGPROB_FLOOR), "bytes": raw}


_BYTE_LEVEL: dict[str, int] = {}  # GPT-2's table, made on first use
_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _piece_kind(tokenizer: Any) -> str | None:
    """``"byte_level"``, ``"metaspace"`` (sentencepiece's ▁), or None: another kind."""
    from tokenizers import decoders

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    if isinstance(backend.decoder, decoders.ByteLevel):
        return "byte_level"
    if backend.decoder is None:
        return None
    # The decoder alone, as JSON (the whole tokenizer's would be its vocabulary too).
    decoder = json.loads(backend.decoder.__getstate__())
    return "metaspace" if "\u2581" in json.dumps(decoder, ensure_ascii=False) else None


def _piece_bytes(piece: str, kind: str) -> list[int] | None:
    """The bytes a vocabulary piece stands for (None: not known)."""
    if kind == "metaspace":
        byte = _BYTE_FALLBACK.fullmatch(piece)
        if byte is not None:
            return [int(byte.group(1), 16)]
        return list(piece.replace("\u2581", " ").encode("utf-8"))
    alphabet = _byte_level_alphabet()
    if all(c in alphabet for c in piece):
        return [alphabet[c] for c in piece]
    return None


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's table: a byte-level BPE's characters and the bytes they stand for
    (printable bytes stand for themselves, the others are 256 + n)."""
    if not _BYTE_LEVEL:
        printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
        alphabet = {chr(b): b for b in printable}
        others = sorted(set(range(256)) - set(printable))
        alphabet.update({chr(256 + n): b for n, b in enumerate(others)})
        _BYTE_LEVEL.update(alphabet)
    return _BYTE_LEVEL
