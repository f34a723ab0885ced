"""What a load must do, decided without I/O: buffers, chunk work, tensor views.

Each safetensors file gets ONE buffer of its data region (``size -
data_offset`` bytes) per load; tensors are views of it. A chunk becomes one
``ChunkWork`` with the places its raw bytes go (``Placement``): usually one,
covering the whole chunk, into which it is decoded directly; more when the
same digest occurs twice (identical tensors), or a partial one when a chunk
straddles a file's header and data (the header part is not needed).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from snapshotter.errors import BadArtifactError, IntegrityError
from snapshotter.manifest import ChunkRef, Manifest, TensorInfo
from snapshotter.pages import PAGE_BYTES
from snapshotter.profile import order_chunks

# safetensors dtype -> torch dtype (those torch 2.x can hold).
DTYPES: dict[str, torch.dtype] = {
    "BOOL": torch.bool,
    "U8": torch.uint8,
    "I8": torch.int8,
    "I16": torch.int16,
    "U16": torch.uint16,
    "I32": torch.int32,
    "U32": torch.uint32,
    "I64": torch.int64,
    "U64": torch.uint64,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F32": torch.float32,
    "F64": torch.float64,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}


@dataclass(frozen=True)
class Placement:
    """Raw chunk bytes ``[src_begin, src_end)`` go to ``dest_begin`` of a file buffer."""

    file_idx: int
    dest_begin: int
    src_begin: int
    src_end: int

    @property
    def nbytes(self) -> int:
        return self.src_end - self.src_begin


@dataclass(frozen=True)
class ChunkWork:
    chunk: ChunkRef
    placements: tuple[Placement, ...]

    @property
    def direct(self) -> Placement | None:
        """A placement that takes the whole chunk, decoded into in place."""
        for p in self.placements:
            if p.src_begin == 0 and p.src_end == self.chunk.size:
                return p
        return None

    @property
    def page_offset(self) -> int:
        """The offset within a page of the chunk's first byte in its (first) file buffer,
        which starts on a page: where a cache entry's payload is placed to be mapped."""
        p = self.direct or self.placements[0]
        return (p.dest_begin - p.src_begin) % PAGE_BYTES


@dataclass(frozen=True)
class FilePlan:
    path: str
    data_bytes: int
    tensors: tuple[TensorInfo, ...]


@dataclass(frozen=True)
class LoadPlan:
    files: tuple[FilePlan, ...]
    work: tuple[ChunkWork, ...]

    @property
    def data_bytes(self) -> int:
        return sum(f.data_bytes for f in self.files)


def plan_load(manifest: Manifest, order: Sequence[str] | None = None) -> LoadPlan:
    """The buffers and chunk work to load every tensor, chunks in prefetch order."""
    files = tuple(_file_plan(manifest, i) for i in range(len(manifest.files)))
    work: dict[str, list[Placement]] = {}
    refs: dict[str, ChunkRef] = {}
    for file_idx, chunk_idx in order_chunks(manifest, order):
        f = manifest.files[file_idx]
        if f.safetensors is None:
            continue
        c = f.chunks[chunk_idx]
        data_offset = f.safetensors.data_offset
        lo, hi = max(c.offset, data_offset), min(c.end, f.size)
        if lo >= hi:
            continue
        refs.setdefault(c.digest, c)
        placement = Placement(file_idx, lo - data_offset, lo - c.offset, hi - c.offset)
        work.setdefault(c.digest, []).append(placement)
    return LoadPlan(files, tuple(ChunkWork(refs[d], tuple(p)) for d, p in work.items()))


def _file_plan(manifest: Manifest, file_idx: int) -> FilePlan:
    f = manifest.files[file_idx]
    if f.safetensors is None:
        return FilePlan(f.path, 0, ())
    data_bytes = f.size - f.safetensors.data_offset
    for t in f.safetensors.tensors:
        _check_tensor(f.path, t, data_bytes)
    return FilePlan(f.path, data_bytes, f.safetensors.tensors)


def _check_tensor(path: str, t: TensorInfo, data_bytes: int) -> None:
    dtype = DTYPES.get(t.dtype)
    if dtype is None:
        raise BadArtifactError(
            f"tensor {t.name!r} in {path} has dtype {t.dtype}, which torch cannot hold; "
            f"supported: {', '.join(DTYPES)}"
        )
    expected = math.prod(t.shape) * dtype.itemsize
    if not 0 <= t.begin <= t.end <= data_bytes or t.end - t.begin != expected:
        raise IntegrityError(
            f"manifest entry of tensor {t.name!r} in {path} is inconsistent: bytes "
            f"[{t.begin}, {t.end}) of {data_bytes}, shape {list(t.shape)} {t.dtype} "
            f"needs {expected}"
        )


def tensor_view(buf: torch.Tensor, t: TensorInfo) -> torch.Tensor:
    """The tensor as a view of ``buf`` (uint8); a copy only if misaligned for its dtype."""
    dtype = DTYPES[t.dtype]
    raw = buf[t.begin : t.end]
    if t.begin % dtype.itemsize:
        # torch views need offsets aligned to the element size.
        raw = raw.clone()
    return raw.view(dtype).view(t.shape)
