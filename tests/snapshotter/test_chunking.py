"""Chunk planning: Hypothesis properties of the pure planner, plus worked examples."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from snapshotter.chunking import Span, fixed_spans, plan_chunks
from snapshotter.manifest import TensorInfo


@st.composite
def safetensors_layouts(draw: st.DrawFn) -> tuple[int, int, list[TensorInfo], int]:
    """(file_size, data_offset, tensors tiling the data region, chunk_size_bytes)."""
    chunk_size = draw(st.integers(min_value=1, max_value=64))
    data_offset = draw(st.integers(min_value=9, max_value=200))
    sizes = draw(st.lists(st.integers(min_value=0, max_value=300), max_size=30))
    tensors, position = [], 0
    for i, size in enumerate(sizes):
        tensors.append(TensorInfo(f"t{i}", "U8", (size,), position, position + size))
        position += size
    return data_offset + position, data_offset, tensors, chunk_size


def _check_cover(spans: list[Span], file_size: int, chunk_size: int) -> None:
    position = 0
    for span in spans:
        assert span.offset == position, "spans must be in order with no gap or overlap"
        assert 0 < span.size <= chunk_size
        position = span.end
    assert position == file_size


@settings(max_examples=300, deadline=None)
@given(safetensors_layouts())
def test_safetensors_plan_properties(layout: tuple[int, int, list[TensorInfo], int]) -> None:
    file_size, data_offset, tensors, chunk_size = layout
    spans = plan_chunks(file_size, chunk_size, data_offset=data_offset, tensors=tensors)
    _check_cover(spans, file_size, chunk_size)
    starts = {s.offset for s in spans}
    assert data_offset in starts or data_offset == file_size, "header must be its own chunk"
    for t in tensors:
        begin, end = data_offset + t.begin, data_offset + t.end
        holders = [s for s in spans if s.offset <= begin and end <= s.end]
        if t.nbytes == 0:
            continue
        if holders:
            assert len(holders) == 1
        else:
            assert begin in starts, f"{t.name} spans several chunks but starts mid-chunk"
            assert t.nbytes > chunk_size


@settings(max_examples=300, deadline=None)
@given(safetensors_layouts())
def test_small_tensors_are_packed_greedily(
    layout: tuple[int, int, list[TensorInfo], int],
) -> None:
    """A packed chunk is closed only when the next small tensor would not fit."""
    file_size, data_offset, tensors, chunk_size = layout
    spans = plan_chunks(file_size, chunk_size, data_offset=data_offset, tensors=tensors)
    big = [(data_offset + t.begin, data_offset + t.end) for t in tensors if t.nbytes > chunk_size]
    small_at = {data_offset + t.begin: t for t in tensors if 0 < t.nbytes <= chunk_size}
    data = [s for s in spans if s.offset >= data_offset]
    for a, b in itertools.pairwise(data):
        a_is_piece = any(begin <= a.offset < end for begin, end in big)
        if not a_is_piece and b.offset in small_at:
            assert a.size + small_at[b.offset].nbytes > chunk_size


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=5000), st.integers(min_value=1, max_value=700))
def test_plain_file_plan_properties(file_size: int, chunk_size: int) -> None:
    spans = plan_chunks(file_size, chunk_size)
    _check_cover(spans, file_size, chunk_size)
    assert all(s.size == chunk_size for s in spans[:-1])


def test_small_neighbours_packed_and_large_tensor_split() -> None:
    tensors = [
        TensorInfo("a", "U8", (3,), 0, 3),
        TensorInfo("b", "U8", (4,), 3, 7),
        TensorInfo("big", "U8", (25,), 7, 32),
        TensorInfo("c", "U8", (2,), 32, 34),
    ]
    spans = plan_chunks(10 + 34, 10, data_offset=10, tensors=tensors)
    assert spans == [
        Span(0, 10),  # header
        Span(10, 7),  # a + b packed
        Span(17, 10),
        Span(27, 10),
        Span(37, 5),  # big: two full pieces and a remainder of its own
        Span(42, 2),  # c starts fresh after the large tensor
    ]


def test_identical_large_tensor_gives_identical_spans_whatever_its_neighbours() -> None:
    big = 30
    first = [TensorInfo("x", "U8", (5,), 0, 5), TensorInfo("w", "U8", (big,), 5, 35)]
    second = [TensorInfo("y", "U8", (1,), 0, 1), TensorInfo("w", "U8", (big,), 1, 31)]
    a = plan_chunks(8 + 35, 8, data_offset=8, tensors=first)
    b = plan_chunks(8 + 31, 8, data_offset=8, tensors=second)
    pieces_a = [(s.offset - 13, s.size) for s in a if s.offset >= 13]
    pieces_b = [(s.offset - 9, s.size) for s in b if s.offset >= 9]
    assert pieces_a == pieces_b == [(0, 8), (8, 8), (16, 8), (24, 6)]


def test_fixed_spans_and_empty_file() -> None:
    assert fixed_spans(0, 0, 4) == []
    assert plan_chunks(0, 4) == []
    assert plan_chunks(9, 4) == [Span(0, 4), Span(4, 4), Span(8, 1)]
