"""Manifests: what one artifact is made of.

A manifest is canonical JSON (sorted keys, no spaces, UTF-8), stored under
its own digest at ``manifests/<hex>``, so the digest names the artifact::

    {
      "schema": "thaw.manifest/v1",
      "kind": "model" | "adapter" | "layer" | "bundle",
      "chunk_size_bytes": 8388608,
      "annotations": {"source": "...", ...},          # free text, optional
      "files": [
        {
          "path": "model-00001-of-00002.safetensors",  # relative, '/'-separated
          "size": 123456,                              # bytes
          "digest": "blake3:…",                        # of the whole file
          "mode": 420,                                 # permission bits
          "chunks": [                                  # cover [0, size) in order
            {"digest": "blake3:…", "offset": 0, "size": 8392,
             "stored_size": 8408, "codec": "raw" | "zstd"}
          ],
          "safetensors": {                             # only for *.safetensors
            "data_offset": 8392,                       # 8 + JSON header length
            "metadata": {"format": "pt"},              # the header's __metadata__
            "tensors": [
              {"name": "lm_head.weight", "dtype": "BF16",
               "shape": [32000, 4096], "begin": 0, "end": 262144000}
            ]                                           # begin/end relative to data_offset
          }
        }
      ]
    }

Chunk digests are of raw bytes; ``stored_size`` includes the codec frame.
A safetensors file's header region ``[0, data_offset)`` is its own chunk;
its data is cut at tensor boundaries (see ``snapshotter.chunking``).
Readers refuse any other ``schema``.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any

from snapshotter.digest import digest_bytes, is_digest
from snapshotter.errors import IntegrityError
from snapshotter.json_doc import parse_json_object

SCHEMA = "thaw.manifest/v1"
DEFAULT_CHUNK_SIZE_BYTES = 8 << 20


class ArtifactKind(enum.StrEnum):
    MODEL = "model"
    ADAPTER = "adapter"
    LAYER = "layer"
    BUNDLE = "bundle"


@dataclass(frozen=True)
class ChunkRef:
    digest: str
    offset: int
    size: int
    stored_size: int
    codec: str

    @property
    def end(self) -> int:
        return self.offset + self.size


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True)
class SafetensorsInfo:
    data_offset: int
    tensors: tuple[TensorInfo, ...]
    metadata: dict[str, str] | None = None

    def tensor(self, name: str) -> TensorInfo:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)


@dataclass(frozen=True)
class FileEntry:
    path: str
    size: int
    digest: str
    chunks: tuple[ChunkRef, ...]
    mode: int = 0o644
    safetensors: SafetensorsInfo | None = None


@dataclass(frozen=True)
class Manifest:
    kind: ArtifactKind
    files: tuple[FileEntry, ...]
    chunk_size_bytes: int = DEFAULT_CHUNK_SIZE_BYTES
    annotations: dict[str, str] = field(default_factory=dict)

    # --- derived figures -------------------------------------------------
    @property
    def raw_size(self) -> int:
        return sum(f.size for f in self.files)

    def unique_chunks(self) -> dict[str, ChunkRef]:
        """One ChunkRef per distinct digest, first occurrence wins."""
        seen: dict[str, ChunkRef] = {}
        for f in self.files:
            for c in f.chunks:
                seen.setdefault(c.digest, c)
        return seen

    @property
    def stored_size(self) -> int:
        return sum(c.stored_size for c in self.unique_chunks().values())

    def file(self, path: str) -> FileEntry:
        for f in self.files:
            if f.path == path:
                return f
        raise KeyError(path)

    def safetensors_files(self) -> list[FileEntry]:
        return [f for f in self.files if f.safetensors is not None]

    # --- serialization ---------------------------------------------------
    def to_json(self) -> bytes:
        return json.dumps(_encode(self), sort_keys=True, separators=(",", ":")).encode()

    @property
    def digest(self) -> str:
        return digest_bytes(self.to_json())

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        try:
            doc = parse_json_object(data, "manifest", error=IntegrityError)
            return _decode(doc)
        except IntegrityError:
            raise
        except (ValueError, KeyError, TypeError) as exc:
            raise IntegrityError(f"manifest is malformed: {exc!r}") from None


def _encode(m: Manifest) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "kind": m.kind.value,
        "chunk_size_bytes": m.chunk_size_bytes,
        "annotations": dict(m.annotations),
        "files": [_encode_file(f) for f in m.files],
    }


def _encode_file(f: FileEntry) -> dict[str, Any]:
    out: dict[str, Any] = {
        "path": f.path,
        "size": f.size,
        "digest": f.digest,
        "mode": f.mode,
        "chunks": [
            {
                "digest": c.digest,
                "offset": c.offset,
                "size": c.size,
                "stored_size": c.stored_size,
                "codec": c.codec,
            }
            for c in f.chunks
        ],
    }
    if f.safetensors is not None:
        st = f.safetensors
        out["safetensors"] = {
            "data_offset": st.data_offset,
            "metadata": st.metadata,
            "tensors": [
                {
                    "name": t.name,
                    "dtype": t.dtype,
                    "shape": list(t.shape),
                    "begin": t.begin,
                    "end": t.end,
                }
                for t in st.tensors
            ],
        }
    return out


def _decode(doc: dict[str, Any]) -> Manifest:
    if doc.get("schema") != SCHEMA:
        raise IntegrityError(
            f"unsupported manifest schema {doc.get('schema')!r}; expected {SCHEMA}"
        )
    files = tuple(_decode_file(f) for f in doc["files"])
    return Manifest(
        kind=ArtifactKind(doc["kind"]),
        files=files,
        chunk_size_bytes=int(doc["chunk_size_bytes"]),
        annotations={str(k): str(v) for k, v in doc.get("annotations", {}).items()},
    )


def _decode_file(f: dict[str, Any]) -> FileEntry:
    chunks = tuple(
        ChunkRef(
            str(c["digest"]),
            int(c["offset"]),
            int(c["size"]),
            int(c["stored_size"]),
            str(c["codec"]),
        )
        for c in f["chunks"]
    )
    expected = 0
    for c in chunks:
        if not is_digest(c.digest) or c.offset != expected or c.size < 0:
            raise IntegrityError(f"manifest chunk list of {f['path']!r} is not contiguous")
        expected = c.end
    if expected != int(f["size"]):
        raise IntegrityError(f"manifest chunks of {f['path']!r} do not cover the file")
    st = None
    if f.get("safetensors") is not None:
        s = f["safetensors"]
        st = SafetensorsInfo(
            data_offset=int(s["data_offset"]),
            metadata=s.get("metadata"),
            tensors=tuple(
                TensorInfo(
                    str(t["name"]),
                    str(t["dtype"]),
                    tuple(int(d) for d in t["shape"]),
                    int(t["begin"]),
                    int(t["end"]),
                )
                for t in s["tensors"]
            ),
        )
    return FileEntry(
        path=str(f["path"]),
        size=int(f["size"]),
        digest=str(f["digest"]),
        chunks=chunks,
        mode=int(f.get("mode", 0o644)),
        safetensors=st,
    )
