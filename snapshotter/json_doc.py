"""JSON from a user's file or a store, parsed so that hostile input is one clear error.

``parse_json(data, what)`` refuses, with ``error`` (``BadArtifactError`` for
what a push reads, ``IntegrityError`` for what a store gave back) and a message
that starts with ``what``:

* nesting deeper than ``max_depth`` (counted on the raw bytes, strings left
  out, before anything is decoded: Python's decoder recurses and would end in
  a ``RecursionError`` past about a thousand levels);
* more than ``max_objects`` objects, counted as they are decoded;
* bytes that are not UTF-8, text that is not JSON or ends early;
* ``NaN`` and ``Infinity`` (not JSON), a number that overflows a double, an
  integer of more than ``MAX_INT_DIGITS`` digits;
* a key twice in one object (the decoder would keep the last silently).

``parse_json_object`` also requires the document to be an object.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator
from itertools import accumulate
from typing import Any

from snapshotter.errors import BadArtifactError, SnapshotterError

MAX_JSON_DEPTH = 64
MAX_INT_DIGITS = 40  # a uint64 has 20; anything past this is no size or offset

# A JSON string, escapes included: brackets inside one do not nest anything.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


class _Refused(Exception):
    """What a decoding hook found wrong; becomes ``error(f"{what} {reason}")``."""


def depths(data: bytes) -> Iterator[int]:
    """The nesting depth at the start and after each bracket, strings left out. Text
    that is not JSON gets depths too, never an error: the decoder says what is wrong."""
    brackets = _STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    return accumulate((_STEP[b] for b in brackets), initial=0)


def deeper_than(data: bytes, max_depth: int) -> bool:
    """Whether ``data`` nests arrays and objects more than ``max_depth`` deep."""
    if data.count(b"[") + data.count(b"{") <= max_depth:  # the common file: no scan
        return False
    return any(depth > max_depth for depth in depths(data))


def parse_json(
    data: bytes,
    what: str,
    *,
    error: type[SnapshotterError] = BadArtifactError,
    max_depth: int = MAX_JSON_DEPTH,
    max_objects: int | None = None,
) -> Any:
    """The document in ``data``; ``error`` naming ``what`` and the fault otherwise."""
    if deeper_than(data, max_depth):
        raise error(f"{what} nests arrays and objects more than {max_depth} levels deep; refused")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{what} is not valid JSON: not UTF-8 (byte {exc.start})") from None
    try:
        return json.loads(
            text,
            object_pairs_hook=_object_hook(max_objects),
            parse_int=_integer,
            parse_float=_finite,
            parse_constant=_no_constant,
        )
    except _Refused as exc:
        raise error(f"{what} {exc}; refused") from None
    except ValueError as exc:  # JSONDecodeError included: says where
        raise error(f"{what} is not valid JSON: {exc}") from None


def parse_json_object(
    data: bytes,
    what: str,
    *,
    error: type[SnapshotterError] = BadArtifactError,
    max_depth: int = MAX_JSON_DEPTH,
    max_objects: int | None = None,
) -> dict[str, Any]:
    """``parse_json``, refusing any document that is not a JSON object."""
    doc = parse_json(data, what, error=error, max_depth=max_depth, max_objects=max_objects)
    if not isinstance(doc, dict):
        raise error(f"{what} is not a JSON object (it holds {_kind(doc)})")
    return doc


def _object_hook(max_objects: int | None) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    seen = 0

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal seen
        seen += 1
        if max_objects is not None and seen > max_objects:
            raise _Refused(f"has more than {max_objects} objects")
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise _Refused(f"names {key[:80]!r} twice in one object")
            out[key] = value
        return out

    return hook


def _integer(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise _Refused(f"has an integer of more than {MAX_INT_DIGITS} digits")
    return int(digits)


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"has a number too large for a double ({text[:40]})")
    return value


def _no_constant(name: str) -> Any:
    raise _Refused(f"has {name}, which is not JSON")


def _kind(doc: Any) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", int: "a number"}
    return "null" if doc is None else names.get(type(doc), "a number")
