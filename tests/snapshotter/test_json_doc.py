"""``json_doc``: what parses is what ``json`` parses; hostile input is one error naming
the file and the fault, never a ``RecursionError`` or a silent last-key-wins."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from snapshotter.errors import BadArtifactError, IntegrityError
from snapshotter.json_doc import (
    MAX_JSON_DEPTH,
    deeper_than,
    depths,
    parse_json,
    parse_json_object,
)

# JSON values whose keys are unique and whose numbers are finite: what a file may hold.
scalars = st.none() | st.booleans() | st.integers(-(2**64), 2**64) | st.text(max_size=8)
values = st.recursive(
    scalars | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=30,
)


def _depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    return 0


@given(values)
def test_parses_what_json_parses(value: Any) -> None:
    data = json.dumps(value).encode()
    assert parse_json(data, "f.json") == json.loads(data)


@given(values)
def test_depth_on_the_raw_bytes_is_the_nesting_depth(value: Any) -> None:
    data = json.dumps(value).encode()
    assert max(depths(data)) == _depth(value)
    assert deeper_than(data, _depth(value)) is False
    if _depth(value) > 0:
        assert deeper_than(data, _depth(value) - 1) is True


@given(st.text(alphabet='[]{}"\\', max_size=20))
def test_brackets_inside_strings_do_not_nest(text: str) -> None:
    assert max(depths(json.dumps(text).encode())) == 0


HOSTILE: dict[str, tuple[bytes, str]] = {
    "100000 deep": (b"[" * 100_000 + b"]" * 100_000, "more than 64 levels deep; refused"),
    "deep objects": (b'{"a":' * 65 + b"1" + b"}" * 65, "more than 64 levels deep"),
    "key twice": (b'{"a": 1, "b": {"c": 2, "c": 3}}', "names 'c' twice"),
    "huge integer": (b"[" + b"9" * 5000 + b"]", "integer of more than 40 digits"),
    "overflowing float": (b"[1e400]", "too large for a double"),
    "NaN": (b'{"a": NaN}', "has NaN, which is not JSON"),
    "Infinity": (b"[-Infinity]", "has -Infinity, which is not JSON"),
    "not UTF-8": (b'{"a": "\xc3\x28"}', "not valid JSON: not UTF-8 (byte 7)"),
    "truncated": (b'{"a": [1, 2', "not valid JSON: Expecting"),
    "empty": (b"", "not valid JSON"),
    "trailing garbage": (b"{} {}", "not valid JSON: Extra data"),
}


@pytest.mark.parametrize("case", HOSTILE)
def test_hostile_input_is_one_line_naming_the_file(case: str) -> None:
    data, message = HOSTILE[case]
    with pytest.raises(BadArtifactError) as info:
        parse_json(data, "sub/config.json")
    text = str(info.value)
    assert text.startswith("sub/config.json ") and message in text
    assert "\n" not in text and len(text) < 300


def test_limits_and_error_type_are_the_callers() -> None:
    with pytest.raises(IntegrityError, match=r"manifest is not a JSON object \(it holds an"):
        parse_json_object(b"[]", "manifest", error=IntegrityError)
    with pytest.raises(BadArtifactError, match="more than 2 objects"):
        parse_json(b"[{}, {}, {}]", "f", max_objects=2)
    assert parse_json(b"[[[1]]]", "f", max_depth=3) == [[[1]]]
    with pytest.raises(BadArtifactError, match="more than 2 levels"):
        parse_json(b"[[[1]]]", "f", max_depth=2)
    nested = b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH
    assert _depth(parse_json(nested, "f")) == MAX_JSON_DEPTH
