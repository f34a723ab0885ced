"""Safetensors header validation, done before anything is written to a store.

A safetensors file is::

    offset  size  field
    0       8     N, the header length, little-endian u64
    8       N     UTF-8 JSON object (may be padded with trailing spaces)
    8 + N   ...   the data region; ``data_offset = 8 + N``

The JSON maps each tensor name to ``{"dtype", "shape", "data_offsets": [begin, end]}``
(offsets relative to ``data_offset``) and may hold one ``"__metadata__"``
object of string to string.

What is refused, each with a ``BadArtifactError`` naming the file and, where
there is one, the tensor:

* a file shorter than 8 bytes, or a header running past the end of the file;
* a header larger than ``MAX_HEADER_BYTES`` (checked before reading it);
* more than ``MAX_TENSORS`` entries (counted while the JSON is decoded, so the
  refusal happens before any per-tensor record is built);
* JSON that is invalid, not an object, nested more than ``MAX_HEADER_DEPTH`` deep,
  or holds a duplicate name (``json_doc.parse_json``);
* an unknown dtype or a shape that is not a list of non-negative integers;
* a shape whose element count times the dtype size is not its byte range;
* offsets that overlap, leave a gap, or run past the end of the file — the
  tensors, sorted by offset, must tile the data region exactly.

The returned ``SafetensorsInfo`` lists tensors in data order (by offset), which
is also the loader's default prefetch order;
empty tensors sharing an offset are ordered by name.
"""

from __future__ import annotations

import math
import struct
from pathlib import Path
from typing import Any

from snapshotter.errors import BadArtifactError
from snapshotter.json_doc import parse_json_object
from snapshotter.manifest import SafetensorsInfo, TensorInfo

LENGTH_PREFIX_BYTES = 8
MAX_HEADER_BYTES = 100 << 20
MAX_TENSORS = 100_000
METADATA_KEY = "__metadata__"

DTYPE_SIZE_BYTES: dict[str, int] = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "F64": 8,
    "I64": 8,
    "U64": 8,
}


def read_safetensors_header(path: Path, display_name: str | None = None) -> SafetensorsInfo:
    """Validate the header of the safetensors file at ``path``; return its layout.

    Reads only the length prefix and the header, never the data region.
    ``display_name`` (default: the path) is the name used in error messages.
    """
    name = display_name or str(path)
    file_size = path.stat().st_size
    with path.open("rb") as f:
        prefix = f.read(LENGTH_PREFIX_BYTES)
        header_len = check_length_prefix(prefix, file_size, name)
        header = f.read(header_len)
    if len(header) != header_len:
        raise BadArtifactError(f"{name}: file changed while its header was read; push again")
    return parse_header(header, file_size, name)


def check_length_prefix(prefix: bytes, file_size: int, name: str) -> int:
    """The header length N from the 8-byte prefix, checked against cap and file size."""
    if len(prefix) < LENGTH_PREFIX_BYTES or file_size < LENGTH_PREFIX_BYTES:
        raise BadArtifactError(
            f"{name}: truncated safetensors file ({file_size} bytes, shorter than the "
            f"{LENGTH_PREFIX_BYTES}-byte header length); re-export it"
        )
    (header_len,) = struct.unpack("<Q", prefix[:LENGTH_PREFIX_BYTES])
    if header_len > MAX_HEADER_BYTES:
        raise BadArtifactError(
            f"{name}: safetensors header claims {header_len} bytes, more than the "
            f"{MAX_HEADER_BYTES >> 20} MiB limit; the file is corrupt or not safetensors"
        )
    if LENGTH_PREFIX_BYTES + header_len > file_size:
        raise BadArtifactError(
            f"{name}: truncated safetensors header: it claims {header_len} bytes but the "
            f"file has only {file_size - LENGTH_PREFIX_BYTES} after the length; re-download it"
        )
    return int(header_len)


def parse_header(header: bytes, file_size: int, name: str) -> SafetensorsInfo:
    """Validate header JSON bytes of a file of ``file_size`` bytes. Pure: no I/O."""
    doc = _decode_json(header, name)
    metadata = _check_metadata(doc.pop(METADATA_KEY, None), name)
    data_offset = LENGTH_PREFIX_BYTES + len(header)
    tensors = sorted(
        (_check_entry(key, entry, name) for key, entry in doc.items()),
        key=lambda t: (t.begin, t.end, t.name),
    )
    _check_tiling(tensors, file_size - data_offset, name)
    return SafetensorsInfo(data_offset=data_offset, tensors=tuple(tensors), metadata=metadata)


# A valid header nests three deep: the table, a tensor's entry, its shape or offsets.
MAX_HEADER_DEPTH = 3


def _decode_json(header: bytes, name: str) -> dict[str, Any]:
    # Tensor entries are objects, counted as they are decoded: a hostile header is
    # stopped before a huge table is built (+ __metadata__ + the top-level object).
    doc = parse_json_object(
        header,
        f"{name}: safetensors header",
        max_depth=MAX_HEADER_DEPTH,
        max_objects=MAX_TENSORS + 2,
    )
    if len(doc) - (METADATA_KEY in doc) > MAX_TENSORS:
        raise BadArtifactError(
            f"{name}: safetensors header has more than {MAX_TENSORS} entries; refused"
        )
    return doc


def _check_metadata(meta: Any, name: str) -> dict[str, str] | None:
    if meta is None:
        return None
    if not isinstance(meta, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in meta.items()
    ):
        raise BadArtifactError(f"{name}: {METADATA_KEY} must map strings to strings")
    return dict(meta)


def _check_entry(tensor: str, entry: Any, name: str) -> TensorInfo:
    where = f"{name}: tensor {tensor!r}"
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise BadArtifactError(f"{where} must have exactly dtype, shape and data_offsets")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if dtype not in DTYPE_SIZE_BYTES:
        known = ", ".join(DTYPE_SIZE_BYTES)
        raise BadArtifactError(f"{where} has unknown dtype {dtype!r} (known: {known})")
    if not isinstance(shape, list) or not all(_is_uint(d) for d in shape):
        raise BadArtifactError(f"{where} has invalid shape {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_is_uint, offsets))):
        raise BadArtifactError(f"{where} has invalid data_offsets {offsets!r}")
    begin, end = offsets
    if end < begin:
        raise BadArtifactError(f"{where} ends ({end}) before it begins ({begin})")
    expected = math.prod(shape) * DTYPE_SIZE_BYTES[dtype]
    if expected != end - begin:
        raise BadArtifactError(
            f"{where}: shape {shape} of {dtype} is {expected} bytes but its data_offsets "
            f"[{begin}, {end}] span {end - begin}"
        )
    return TensorInfo(name=tensor, dtype=dtype, shape=tuple(shape), begin=begin, end=end)


def _is_uint(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_tiling(tensors: list[TensorInfo], data_size: int, name: str) -> None:
    """Sorted tensors must cover ``[0, data_size)`` exactly, no overlap, no gap."""
    position = 0
    for t in tensors:
        if t.end > data_size:
            raise BadArtifactError(
                f"{name}: tensor {t.name!r} ends at data offset {t.end}, past the end of "
                f"the data ({data_size} bytes); the file is truncated or corrupt"
            )
        if t.begin < position:
            raise BadArtifactError(
                f"{name}: tensor {t.name!r} at [{t.begin}, {t.end}] overlaps the tensor "
                f"before it (which ends at {position})"
            )
        if t.begin > position:
            raise BadArtifactError(
                f"{name}: non-contiguous data: {t.begin - position} bytes before tensor "
                f"{t.name!r} belong to no tensor"
            )
        position = t.end
    if position != data_size:
        raise BadArtifactError(
            f"{name}: non-contiguous data: {data_size - position} trailing bytes after the "
            "last tensor belong to no tensor"
        )
