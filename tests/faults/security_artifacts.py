"""Hostile artifacts for the security tests: decompression bombs and bad safetensors."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch
import zstandard
from safetensors.torch import save_file

from snapshotter import codec
from snapshotter.manifest import ChunkRef
from snapshotter.registry import Registry

BOMB_RAW_BYTES = 256 << 20
_PIECE_BYTES = 1 << 20


def compressible_model(directory: Path) -> Path:
    """A model whose tensor data compresses well, so some chunks are stored as zstd."""
    directory.mkdir()
    pattern = torch.arange(64, dtype=torch.float32).repeat(256, 4)
    save_file({"a": pattern, "b": torch.zeros(128, 128)}, directory / "model.safetensors")
    (directory / "config.json").write_text("{}")
    return directory


def zstd_chunk(registry: Registry, digest: str) -> ChunkRef:
    """A tensor-data chunk of the manifest stored with the zstd codec."""
    manifest = registry.get_manifest(digest)
    for f in manifest.safetensors_files():
        assert f.safetensors is not None
        for c in f.chunks:
            if c.codec == "zstd" and c.offset >= f.safetensors.data_offset:
                return c
    raise AssertionError("the model has no zstd chunk; make it more compressible")


def zstd_bomb(raw_bytes: int, claim_size: bool) -> bytes:
    """A zstd frame of ``raw_bytes`` zeros, compressed piece by piece (never held whole).

    ``claim_size``: the frame header states its content size; otherwise it does not,
    and only decompressing reveals how far it expands.
    """
    packer = zstandard.ZstdCompressor(write_content_size=claim_size)
    obj = packer.compressobj(size=raw_bytes if claim_size else -1)
    zeros = bytes(_PIECE_BYTES)
    parts = [obj.compress(zeros) for _ in range(raw_bytes // _PIECE_BYTES)]
    parts.append(obj.compress(bytes(raw_bytes % _PIECE_BYTES)))
    return b"".join(parts) + obj.flush()


def framed_bomb(kind: str, declared_size: int) -> bytes:
    """A stored chunk object for a chunk the manifest declares as ``declared_size`` bytes.

    ``thc-header``: thaw's own frame claims far more than declared;
    ``zstd-claims``: the zstd frame header claims ``BOMB_RAW_BYTES``;
    ``zstd-expands``: the zstd frame claims nothing and expands to ``BOMB_RAW_BYTES``.
    """
    if kind == "thc-header":
        payload = zstd_bomb(declared_size, claim_size=True)
        return codec.HEADER.pack(codec.MAGIC, codec.Codec.ZSTD, 1 << 40) + payload
    payload = zstd_bomb(BOMB_RAW_BYTES, claim_size=kind == "zstd-claims")
    return codec.HEADER.pack(codec.MAGIC, codec.Codec.ZSTD, declared_size) + payload


def safetensors_with_header(path: Path, header: dict[str, object], data_bytes: int) -> Path:
    """Write a safetensors file with exactly ``header`` and ``data_bytes`` zero bytes of data."""
    raw = json.dumps(header, separators=(",", ":")).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(data_bytes))
    return path


def many_entries_header(count: int) -> dict[str, object]:
    """``count`` one-byte U8 tensors tiling the data region exactly."""
    return {
        f"t{i}": {"dtype": "U8", "shape": [1], "data_offsets": [i, i + 1]} for i in range(count)
    }
