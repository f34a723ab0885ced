"""Safetensors header validation: real files accepted, every malformed case refused."""

from __future__ import annotations

import json
import math
import random
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from snapshotter.errors import BadArtifactError
from snapshotter.safetensors_header import (
    DTYPE_SIZE_BYTES,
    MAX_HEADER_BYTES,
    MAX_TENSORS,
    parse_header,
    read_safetensors_header,
)


def raw_file(header: dict[str, Any] | bytes, data: bytes = b"") -> bytes:
    body = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(body)) + body + data


def write(tmp_path: Path, content: bytes, name: str = "model.safetensors") -> Path:
    path = tmp_path / name
    path.write_bytes(content)
    return path


def entry(dtype: str, shape: list[int], begin: int, end: int) -> dict[str, Any]:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def test_real_file_round_trips(tmp_path: Path) -> None:
    tensors = {
        "b": torch.zeros(3, 5, dtype=torch.bfloat16),
        "a": torch.ones(7, dtype=torch.float32),
        "e": torch.zeros(0, 4, dtype=torch.int64),
        "f8": torch.zeros(6, dtype=torch.float8_e4m3fn),
    }
    path = tmp_path / "x.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    info = read_safetensors_header(path)
    assert info.metadata == {"format": "pt"}
    assert {t.name: (t.dtype, t.shape) for t in info.tensors} == {
        "b": ("BF16", (3, 5)),
        "a": ("F32", (7,)),
        "e": ("I64", (0, 4)),
        "f8": ("F8_E4M3", (6,)),
    }
    begins = [t.begin for t in info.tensors]
    assert begins == sorted(begins), "tensors are listed in data order"
    data = path.read_bytes()[info.data_offset :]
    a = info.tensor("a")
    assert data[a.begin : a.end] == tensors["a"].numpy().tobytes()


def test_every_documented_dtype_is_known() -> None:
    documented = "BOOL U8 I8 I16 U16 F16 BF16 I32 U32 F32 F64 I64 U64 F8_E4M3 F8_E5M2"
    for dtype in documented.split(" "):
        header = json.dumps({"t": entry(dtype, [2], 0, 2 * DTYPE_SIZE_BYTES[dtype])}).encode()
        info = parse_header(header, 8 + len(header) + 2 * DTYPE_SIZE_BYTES[dtype], "f")
        assert info.tensors[0].dtype == dtype


BAD_FILES: dict[str, tuple[bytes, str]] = {
    "shorter than prefix": (b"\x01\x00\x00", "truncated safetensors file"),
    "truncated header": (struct.pack("<Q", 500) + b"{}", "truncated safetensors header"),
    "absurd header": (struct.pack("<Q", MAX_HEADER_BYTES + 1) + b"{}", "MiB limit"),
    "invalid json": (raw_file(b'{"t": '), "not valid JSON"),
    "not utf-8": (raw_file(b'{"\xff": 1}'), "not valid JSON"),
    "not an object": (raw_file(b"[1, 2]"), "not a JSON object"),
    "duplicate name": (
        raw_file(b'{"w": {"dtype":"U8","shape":[1],"data_offsets":[0,1]}, "w": {}}', b"x"),
        "names 'w' twice",
    ),
    "unknown dtype": (raw_file({"w": entry("F7", [1], 0, 1)}, b"x"), "unknown dtype 'F7'"),
    "negative dim": (raw_file({"w": entry("U8", [-1], 0, 1)}, b"x"), "invalid shape"),
    "missing field": (raw_file({"w": {"dtype": "U8", "shape": [1]}}, b"x"), "'w' must have"),
    "shape mismatch": (
        raw_file({"w": entry("F32", [2, 3], 0, 20)}, bytes(20)),
        "shape [2, 3] of F32 is 24 bytes",
    ),
    "overlap": (
        raw_file({"a": entry("U8", [4], 0, 4), "b": entry("U8", [4], 2, 6)}, bytes(6)),
        "'b' at [2, 6] overlaps",
    ),
    "gap": (
        raw_file({"a": entry("U8", [4], 0, 4), "b": entry("U8", [2], 6, 8)}, bytes(8)),
        "non-contiguous data: 2 bytes before tensor 'b'",
    ),
    "trailing bytes": (raw_file({"a": entry("U8", [4], 0, 4)}, bytes(7)), "3 trailing bytes"),
    "out of range": (
        raw_file({"a": entry("U8", [4], 0, 4), "b": entry("U8", [8], 4, 12)}, bytes(8)),
        "'b' ends at data offset 12, past the end",
    ),
    "bad metadata": (raw_file({"__metadata__": {"k": 1}}), "__metadata__ must map"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_headers_refused_naming_file_and_tensor(tmp_path: Path, case: str) -> None:
    content, message = BAD_FILES[case]
    path = write(tmp_path, content)
    with pytest.raises(BadArtifactError) as info:
        read_safetensors_header(path, display_name="shard-1.safetensors")
    assert message in str(info.value)
    assert str(info.value).startswith("shard-1.safetensors: ")


def test_too_many_entries_refused() -> None:
    entries = {f"t{i}": entry("U8", [0], 0, 0) for i in range(MAX_TENSORS + 1)}
    header = json.dumps(entries).encode()
    with pytest.raises(BadArtifactError, match=f"more than {MAX_TENSORS} entries"):
        parse_header(header, 8 + len(header), "huge.safetensors")


def test_many_entries_up_to_the_limit_accepted() -> None:
    entries = {f"t{i}": entry("U8", [0], 0, 0) for i in range(1000)}
    header = json.dumps(entries).encode()
    assert len(parse_header(header, 8 + len(header), "ok").tensors) == 1000


@st.composite
def tensor_tables(draw: st.DrawFn) -> list[tuple[str, str, list[int]]]:
    names = draw(
        st.lists(st.text("abc.xyz_0123", min_size=1, max_size=8), unique=True, max_size=12)
    )
    dtypes = st.sampled_from(sorted(DTYPE_SIZE_BYTES))
    shapes = st.lists(st.integers(min_value=0, max_value=5), max_size=3)
    return [(n, draw(dtypes), draw(shapes)) for n in names if n != "__metadata__"]


@settings(max_examples=150, deadline=None)
@given(tensor_tables(), st.randoms(use_true_random=False))
def test_any_well_formed_table_round_trips(
    table: list[tuple[str, str, list[int]]], rnd: random.Random
) -> None:
    header: dict[str, Any] = {}
    position = 0
    for name, dtype, shape in table:
        size = math.prod(shape) * DTYPE_SIZE_BYTES[dtype]
        header[name] = entry(dtype, shape, position, position + size)
        position += size
    keys = list(header)
    rnd.shuffle(keys)  # JSON key order must not matter
    body = json.dumps({k: header[k] for k in keys}).encode()
    info = parse_header(body, 8 + len(body) + position, "f")
    expected = sorted(header.items(), key=lambda kv: (*kv[1]["data_offsets"], kv[0]))
    assert [(t.name, t.dtype, list(t.shape), [t.begin, t.end]) for t in info.tensors] == [
        (name, e["dtype"], e["shape"], e["data_offsets"]) for name, e in expected
    ]
    assert info.data_offset == 8 + len(body)
    if position:
        with pytest.raises(BadArtifactError):
            parse_header(body, 8 + len(body) + position - 1, "f")
