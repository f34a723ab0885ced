"""The invoke body's checks (``api.invoke_body``): nesting measured on the raw
bytes, as deep as the parsed value nests, strings left out; JSON content types."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from control_plane.api.invoke_body import check, deeper_than, is_json, nesting_depth
from control_plane.errors import BadRequestError, UnsupportedMediaTypeError

# Strings with brackets, quotes and backslashes in them: none of those nest anything.
_TEXT = st.text(alphabet=st.sampled_from('[]{}"\\ab\u00e9'), max_size=6)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=30,
)


def _depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0


def _nested(depth: int) -> bytes:
    return b'{"input": ' + b"[" * (depth - 1) + b"1" + b"]" * (depth - 1) + b"}"


@given(_JSON, st.booleans())
def test_depth_of_the_text_is_the_depth_of_the_value(value: Any, ascii_only: bool) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only).encode()
    assert nesting_depth(text) == _depth(value)


@given(_JSON, st.integers(min_value=0, max_value=12))
def test_deeper_than_agrees_with_the_depth(value: Any, max_depth: int) -> None:
    text = json.dumps(value).encode()
    assert deeper_than(text, max_depth) == (_depth(value) > max_depth)


@pytest.mark.parametrize("depth", [64, 65, 300, 900, 100_000])
def test_bodies_nested_past_the_limit_are_refused_naming_the_setting(depth: int) -> None:
    body = _nested(depth)
    assert nesting_depth(body) == depth
    if depth <= 64:
        check(body, "application/json", 64)
        return
    with pytest.raises(BadRequestError, match=r"more than 64 levels deep \(THAW_MAX_BODY_DEPTH\)"):
        check(body, "application/json", 64)


def test_text_that_is_not_json_gets_a_depth_never_an_error() -> None:
    assert nesting_depth(b"]]]{") == 0
    assert nesting_depth(b'["unterminated') == 1
    assert not deeper_than(b"{" * 3, 3)


@pytest.mark.parametrize(
    ("content_type", "json_"),
    [
        ("application/json", True),
        ("Application/JSON; charset=utf-8", True),
        ("application/merge-patch+json", True),
        ("text/plain", False),
        ("application/jsonx", False),
        ("multipart/form-data; boundary=x", False),
        (None, False),
    ],
)
def test_json_content_types(content_type: str | None, json_: bool) -> None:
    assert is_json(content_type) is json_


def test_a_body_not_sent_as_json_is_refused_and_an_empty_one_passes() -> None:
    with pytest.raises(UnsupportedMediaTypeError, match="Content-Type: application/json"):
        check(b'{"input": 1}', "text/plain", 64)
    check(b"", None, 64)  # the route says the body is missing
