"""Container layers as chunks: a layer tar becomes a table of contents plus chunks.

A layer's table of contents (TOC) is canonical JSON (sorted keys, no spaces),
stored under its own digest at ``layers/<hex>``::

    {
      "schema": "thaw.layer/v1",
      "chunk_size_bytes": 8388608,
      "entries": [                                   # tar order, one per path
        {"path": "usr/bin/python3.11",               # relative, '/'-separated
         "type": "file",                             # file | dir | symlink | hardlink
                                                     # | fifo | whiteout | opaque
         "mode": 493, "uid": 0, "gid": 0,            # permission bits, owner
         "mtime": 1700000000,                        # seconds
         "size": 6831704,                            # bytes (0 unless file/hardlink)
         "link": "",                                 # symlink target / hard link source
         "digest": "blake3:…",                       # whole content (file/hardlink)
         "chunks": [{"digest": …, "offset": 0, "size": …,
                     "stored_size": …, "codec": "raw" | "zstd"}]}
      ]
    }

Whiteouts are recorded as what they mean, not as their marker files:
``etc/.wh.motd`` becomes ``{"path": "etc/motd", "type": "whiteout"}`` and
``var/.wh..wh..opq`` becomes ``{"path": "var", "type": "opaque"}``. A hard
link carries its source's chunks, so a reader can serve it like a file.

Refused at push (``BadArtifactError`` naming the entry): absolute paths,
``..`` components, symbolic links whose target climbs above the layer's root
(absolute targets are read inside the image's root, as the container sees
them), hard links to anything but an earlier file of the same layer, entries
below a symbolic link of the same layer (tar would write through the link),
and character or block devices. Nothing is ever extracted: the tar is read as
a stream and only chunks and the TOC are written, to the store.
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

from snapshotter import codec
from snapshotter.chunking import plan_chunks
from snapshotter.digest import Hasher, digest_bytes, hex_part, is_digest
from snapshotter.errors import BadArtifactError, IntegrityError, NotFoundError
from snapshotter.json_doc import parse_json_object
from snapshotter.leases import LeaseKeeper
from snapshotter.manifest import DEFAULT_CHUNK_SIZE_BYTES, ChunkRef
from snapshotter.registry import Registry

LAYER_SCHEMA = "thaw.layer/v1"
WHITEOUT_PREFIX = ".wh."
OPAQUE_MARKER = ".wh..wh..opq"
ENTRY_TYPES = ("file", "dir", "symlink", "hardlink", "fifo", "whiteout", "opaque")
CONTENT_TYPES = ("file", "hardlink")
MARKER_TYPES = ("whiteout", "opaque")


@dataclass(frozen=True)
class TocEntry:
    path: str
    type: str
    mode: int = 0o644
    uid: int = 0
    gid: int = 0
    mtime: int = 0
    size: int = 0
    link: str = ""
    digest: str = ""
    chunks: tuple[ChunkRef, ...] = ()

    @property
    def has_content(self) -> bool:
        return self.type in CONTENT_TYPES


@dataclass(frozen=True)
class LayerToc:
    entries: tuple[TocEntry, ...]
    chunk_size_bytes: int = DEFAULT_CHUNK_SIZE_BYTES

    def to_json(self) -> bytes:
        doc = {
            "schema": LAYER_SCHEMA,
            "chunk_size_bytes": self.chunk_size_bytes,
            "entries": [_encode_entry(e) for e in self.entries],
        }
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @property
    def digest(self) -> str:
        return digest_bytes(self.to_json())

    @property
    def content_bytes(self) -> int:
        return sum(e.size for e in self.entries if e.type == "file")

    @classmethod
    def from_json(cls, data: bytes) -> LayerToc:
        try:
            doc = parse_json_object(data, "layer table of contents", error=IntegrityError)
            if doc.get("schema") != LAYER_SCHEMA:
                raise IntegrityError(
                    f"unsupported layer schema {doc.get('schema')!r}; expected {LAYER_SCHEMA}"
                )
            entries = tuple(_decode_entry(e) for e in doc["entries"])
            return cls(entries, int(doc["chunk_size_bytes"]))
        except IntegrityError:
            raise
        except (ValueError, KeyError, TypeError) as exc:
            raise IntegrityError(f"layer table of contents is malformed: {exc!r}") from None


def _encode_entry(e: TocEntry) -> dict[str, Any]:
    doc = {f.name: getattr(e, f.name) for f in dataclasses.fields(e) if f.name != "chunks"}
    doc["chunks"] = [dataclasses.asdict(c) for c in e.chunks]
    return doc


def _decode_entry(d: dict[str, Any]) -> TocEntry:
    chunks = tuple(
        ChunkRef(
            str(c["digest"]),
            int(c["offset"]),
            int(c["size"]),
            int(c["stored_size"]),
            str(c["codec"]),
        )
        for c in d["chunks"]
    )
    entry = TocEntry(
        path=str(d["path"]), type=str(d["type"]), mode=int(d["mode"]), uid=int(d["uid"]),
        gid=int(d["gid"]), mtime=int(d["mtime"]), size=int(d["size"]), link=str(d["link"]),
        digest=str(d["digest"]), chunks=chunks,
    )  # fmt: skip
    _check_decoded(entry)
    return entry


def _check_decoded(e: TocEntry) -> None:
    """A stored TOC is re-checked: a reader must not trust a tampered store."""
    if e.type not in ENTRY_TYPES:
        raise IntegrityError(f"layer entry {e.path!r} has unknown type {e.type!r}")
    if normalize_path(e.path) != e.path:
        raise IntegrityError(f"layer entry path {e.path!r} is not a clean relative path")
    expected = 0
    for c in e.chunks:
        if not is_digest(c.digest) or c.offset != expected or c.size < 0:
            raise IntegrityError(f"chunk list of layer entry {e.path!r} is not contiguous")
        expected = c.end
    if expected != e.size:
        raise IntegrityError(f"chunks of layer entry {e.path!r} do not cover its size")


# --- validation (pure) -------------------------------------------------------
def normalize_path(name: str) -> str:
    """``./usr//bin/`` → ``usr/bin``; ``""`` for the root itself. No checks."""
    parts = [p for p in name.split("/") if p not in ("", ".")]
    return "/".join(parts)


def check_entry_name(name: str) -> str:
    """The clean relative path of a tar entry name; raise for an escaping one."""
    if name.startswith("/"):
        raise BadArtifactError(
            f"layer entry {name!r} has an absolute path; layer tars hold relative paths only"
        )
    if ".." in name.split("/"):
        raise BadArtifactError(f"layer entry {name!r} has a '..' component; refused")
    return normalize_path(name)


def symlink_escapes(path: str, target: str) -> bool:
    """Whether ``target`` of the link at ``path`` climbs above the image's root.

    Absolute targets start at the image root (as the container resolves them);
    relative ones at the link's directory. Lexical: links are not followed.
    """
    start = [] if target.startswith("/") else path.split("/")[:-1]
    depth = len(start)
    for part in target.split("/"):
        if part == "..":
            depth -= 1
            if depth < 0:
                return True
        elif part not in ("", "."):
            depth += 1
    return False


def _classify(member: tarfile.TarInfo, path: str) -> tuple[str, str]:
    """(type, path) of a member, whiteout markers translated."""
    base = posixpath.basename(path)
    parent = posixpath.dirname(path)
    if base == OPAQUE_MARKER:
        return "opaque", parent
    if base.startswith(WHITEOUT_PREFIX):
        return "whiteout", posixpath.join(parent, base[len(WHITEOUT_PREFIX) :])
    if member.isreg():
        return "file", path
    if member.isdir():
        return "dir", path
    if member.issym():
        return "symlink", path
    if member.islnk():
        return "hardlink", path
    if member.isfifo():
        return "fifo", path
    if member.ischr() or member.isblk():
        kind = "character" if member.ischr() else "block"
        raise BadArtifactError(
            f"layer entry {member.name!r} is a {kind} device node; images may not carry "
            "device nodes (the runtime provides /dev)"
        )
    raise BadArtifactError(f"layer entry {member.name!r} has unsupported tar type {member.type!r}")


# --- push --------------------------------------------------------------------
@dataclass(frozen=True)
class LayerProgress:
    bytes_done: int
    chunks_new: int
    chunks_deduplicated: int


@dataclass
class ChunkSink:
    """Frames and uploads chunks, skipping digests already stored or seen.

    Shared by every layer of a push, so a chunk repeated across layers and
    images is uploaded once. Not thread-safe. With a ``lease``, every chunk is
    named in it before it is looked up, and ``found`` keeps those already
    stored, for ``snapshotter.leases.confirm_stored`` before the tag.
    """

    registry: Registry
    progress: Callable[[LayerProgress], None] | None = None
    seen: dict[str, tuple[int, str]] = field(default_factory=dict)  # digest -> stored, codec
    bytes_done: int = 0
    chunks_new: int = 0
    chunks_deduplicated: int = 0
    new_stored_bytes: int = 0
    lease: LeaseKeeper | None = None
    found: set[str] = field(default_factory=set)

    def put(self, raw: bytes, offset: int) -> ChunkRef:
        digest = digest_bytes(raw)
        known = self.seen.get(digest)
        if known is None:
            framed, used = codec.encode(raw)
            known = (len(framed), used.label)
            if self.lease is not None:
                self.lease.add(chunks=[digest])
            if self.registry.has_chunk(digest):
                self.chunks_deduplicated += 1
                self.found.add(digest)
            else:
                self.registry.put_chunk(digest, framed)
                self.chunks_new += 1
                self.new_stored_bytes += len(framed)
            self.seen[digest] = known
        else:
            self.chunks_deduplicated += 1
        self.bytes_done += len(raw)
        if self.progress is not None:
            self.progress(LayerProgress(self.bytes_done, self.chunks_new, self.chunks_deduplicated))
        return ChunkRef(digest, offset, len(raw), known[0], known[1])


def read_layer(
    stream: IO[bytes], sink: ChunkSink, *, chunk_size_bytes: int = DEFAULT_CHUNK_SIZE_BYTES
) -> LayerToc:
    """Read a layer tar (plain or compressed) as a stream; chunk its files into ``sink``.

    Returns the TOC; does not store it. Raises ``BadArtifactError`` naming the
    first refused entry; chunks of entries before it may already be stored
    (harmless: nothing refers to them).
    """
    entries: dict[str, TocEntry] = {}
    try:
        with tarfile.open(fileobj=stream, mode="r|*") as tar:
            for member in tar:
                entry = _read_member(tar, member, entries, sink, chunk_size_bytes)
                if entry is not None:
                    # Markers are keyed apart: ``d/.wh..wh..opq`` must not replace dir ``d``.
                    key = (
                        entry.path
                        if entry.type not in MARKER_TYPES
                        else f"{entry.type}:{entry.path}"
                    )
                    entries.pop(key, None)  # a later duplicate wins, in its place
                    entries[key] = entry
    except tarfile.TarError as exc:
        raise BadArtifactError(f"layer is not a readable tar archive: {exc}") from None
    return LayerToc(tuple(entries.values()), chunk_size_bytes)


def _read_member(
    tar: tarfile.TarFile,
    member: tarfile.TarInfo,
    earlier: dict[str, TocEntry],
    sink: ChunkSink,
    chunk_size_bytes: int,
) -> TocEntry | None:
    path = check_entry_name(member.name)
    if not path:
        return None  # the root directory itself
    kind, path = _classify(member, path)
    _check_parents(member.name, path, earlier)
    base = TocEntry(
        path=path, type=kind, mode=member.mode & 0o7777, uid=member.uid, gid=member.gid,
        mtime=int(member.mtime),
    )  # fmt: skip
    if kind == "symlink":
        if symlink_escapes(path, member.linkname):
            raise BadArtifactError(
                f"layer entry {member.name!r} is a symbolic link to {member.linkname!r}, "
                "which leaves the image's root"
            )
        return _replace(base, link=member.linkname)
    if kind == "hardlink":
        return _hardlink(member, base, earlier)
    if kind == "file":
        return _file(tar, member, base, sink, chunk_size_bytes)
    if kind in ("whiteout", "opaque"):
        return _replace(base, mode=0)
    return base


def _check_parents(name: str, path: str, earlier: dict[str, TocEntry]) -> None:
    parent = posixpath.dirname(path)
    while parent:
        above = earlier.get(parent)
        if above is not None and above.type == "symlink":
            raise BadArtifactError(
                f"layer entry {name!r} lies below {parent!r}, a symbolic link in the same "
                "layer; extracting it would write through the link"
            )
        parent = posixpath.dirname(parent)


def _hardlink(member: tarfile.TarInfo, base: TocEntry, earlier: dict[str, TocEntry]) -> TocEntry:
    link = member.linkname
    if link.startswith("/") or ".." in link.split("/"):
        raise BadArtifactError(
            f"layer entry {member.name!r} is a hard link to {link!r}, which leaves the layer's root"
        )
    source = earlier.get(normalize_path(link))
    if source is None or not source.has_content:
        raise BadArtifactError(
            f"layer entry {member.name!r} is a hard link to {link!r}, which is not an "
            "earlier regular file of the same layer"
        )
    return _replace(
        base, link=source.path, size=source.size, digest=source.digest, chunks=source.chunks
    )


def _file(
    tar: tarfile.TarFile,
    member: tarfile.TarInfo,
    base: TocEntry,
    sink: ChunkSink,
    chunk_size_bytes: int,
) -> TocEntry:
    handle = tar.extractfile(member)
    if handle is None:
        raise BadArtifactError(f"layer entry {member.name!r} has no readable content")
    hasher = Hasher()
    chunks = []
    for span in plan_chunks(member.size, chunk_size_bytes):
        raw = handle.read(span.size)
        if len(raw) != span.size:
            raise BadArtifactError(f"layer entry {member.name!r} is truncated")
        hasher.update(raw)
        chunks.append(sink.put(raw, span.offset))
    return _replace(base, size=member.size, digest=hasher.digest(), chunks=tuple(chunks))


def _replace(entry: TocEntry, **changes: Any) -> TocEntry:
    return dataclasses.replace(entry, **changes)


# --- storage -----------------------------------------------------------------
def layer_key(digest: str) -> str:
    return f"layers/{hex_part(digest)}"


def put_layer(registry: Registry, toc: LayerToc) -> str:
    """Store a TOC (idempotent); return its digest."""
    data = toc.to_json()
    digest = digest_bytes(data)
    key = layer_key(digest)
    if not registry.store.exists(key):
        registry.store.put(key, data)
    return digest


def get_layer(registry: Registry, digest: str) -> LayerToc:
    """Read and verify a TOC. Raises ``NotFoundError`` or ``IntegrityError``."""
    try:
        data = registry.store.get(layer_key(digest))
    except NotFoundError:
        raise NotFoundError(f"layer {digest} is not in store {registry.store.url}") from None
    if digest_bytes(data) != digest:
        raise IntegrityError(f"layer {digest} in store {registry.store.url} is corrupt")
    return LayerToc.from_json(data)
