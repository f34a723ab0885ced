"""Where a file is cut into chunks: a pure function of its layout.

Rules, in order:

* A safetensors file's header region ``[0, data_offset)`` is its own chunk
  (split into ``chunk_size_bytes`` pieces only if it is larger than that), so
  two shards with the same tensor table share it.
* Its data region is cut at tensor boundaries. Tensors no larger than the
  chunk size are packed, in file order, with their neighbours until the next
  one would not fit. A tensor larger than the chunk size starts a new chunk
  and is split into full pieces plus a remainder, and the chunk after it
  starts fresh, so its pieces hold only its own bytes: an identical large
  tensor in another model yields identical chunks whatever its neighbours.
* Any other file is one chunk if it fits, else fixed ``chunk_size_bytes``
  pieces. An empty file has no chunks.

Guarantees (checked by Hypothesis in ``tests/snapshotter/test_chunking.py``):
spans are in order and cover ``[0, file_size)`` exactly once; none is larger
than the chunk size (nor empty); a tensor cut into several chunks starts on a
chunk boundary; any other tensor lies wholly inside one chunk.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from snapshotter.manifest import TensorInfo


class Span(NamedTuple):
    """A chunk's place in its file: ``[offset, offset + size)``."""

    offset: int
    size: int

    @property
    def end(self) -> int:
        return self.offset + self.size


def plan_chunks(
    file_size: int,
    chunk_size_bytes: int,
    *,
    data_offset: int | None = None,
    tensors: Sequence[TensorInfo] = (),
) -> list[Span]:
    """The chunk spans of one file.

    Give ``data_offset`` and ``tensors`` (begin/end relative to ``data_offset``,
    tiling the data region, as ``safetensors_header`` guarantees) for a
    safetensors file; leave them out for any other file.
    """
    if chunk_size_bytes <= 0:
        raise ValueError(f"chunk_size_bytes must be positive, got {chunk_size_bytes}")
    if data_offset is None:
        return fixed_spans(0, file_size, chunk_size_bytes)
    if not 0 < data_offset <= file_size:
        raise ValueError(f"data_offset {data_offset} outside a file of {file_size} bytes")
    header = fixed_spans(0, data_offset, chunk_size_bytes)
    return header + tensor_spans(data_offset, file_size, tensors, chunk_size_bytes)


def fixed_spans(start: int, end: int, chunk_size_bytes: int) -> list[Span]:
    """``[start, end)`` in pieces of ``chunk_size_bytes``, the last one shorter."""
    return [
        Span(offset, min(chunk_size_bytes, end - offset))
        for offset in range(start, end, chunk_size_bytes)
    ]


def tensor_spans(
    data_offset: int, file_size: int, tensors: Sequence[TensorInfo], chunk_size_bytes: int
) -> list[Span]:
    """Spans of the data region ``[data_offset, file_size)``, cut at tensor boundaries."""
    spans: list[Span] = []
    group_start = data_offset  # absolute offset where the current packed chunk begins
    position = data_offset
    for t in sorted(tensors, key=lambda t: (t.begin, t.end)):
        begin, end = data_offset + t.begin, data_offset + t.end
        if begin != position or end > file_size:
            raise ValueError(f"tensor {t.name!r} does not tile the data region at {position}")
        if t.nbytes > chunk_size_bytes:
            spans += _close(group_start, begin)
            spans += fixed_spans(begin, end, chunk_size_bytes)
            group_start = end
        elif end - group_start > chunk_size_bytes:
            spans += _close(group_start, begin)
            group_start = begin
        position = end
    if position != file_size:
        raise ValueError(f"tensors end at {position}, the file at {file_size}")
    return spans + _close(group_start, file_size)


def _close(start: int, end: int) -> list[Span]:
    """The packed chunk ``[start, end)``, or nothing if it is empty."""
    return [Span(start, end - start)] if end > start else []
