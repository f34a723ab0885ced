"""Container images as chunks: ordered layer TOCs plus the run configuration.

An image document is canonical JSON stored under its digest at ``images/<hex>``::

    {
      "schema": "thaw.image/v1",
      "layers": ["blake3:…", …],            # layer TOC digests, bottom first
      "config": {"env": ["PATH=…"], "entrypoint": […], "cmd": […],
                 "working_dir": "", "user": ""},
      "annotations": {"source": "debian:bookworm", …}
    }

Image tags live apart from model tags, at ``image-tags/<name>/<tag>``, so
``thaw models ls`` never lists an image. The prefetch profile of an image
(files read before the first output, in order) is stored with the registry's
profiles, keyed by the image digest.

``push_image_archive`` reads ``docker save`` output as a stream: each layer
tar is turned into a TOC (``snapshotter.layers``) as it passes; the image's
``manifest.json`` (which, in ``docker save`` output, comes last) orders them.
Chunks are shared by every layer and image in the store.

``merge_layers`` is the pure view a lazy mount serves: layers applied bottom
to top, whiteouts and opaque directories honoured.
"""

from __future__ import annotations

import io
import json
import posixpath
import tarfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from snapshotter.digest import digest_bytes, hex_part, is_digest
from snapshotter.errors import (
    BadArtifactError,
    IntegrityError,
    InvalidReferenceError,
    NotFoundError,
)
from snapshotter.json_doc import parse_json, parse_json_object
from snapshotter.layers import (
    ChunkSink,
    LayerProgress,
    LayerToc,
    TocEntry,
    get_layer,
    put_layer,
    read_layer,
)
from snapshotter.leases import LeaseKeeper, confirm_stored
from snapshotter.manifest import DEFAULT_CHUNK_SIZE_BYTES
from snapshotter.registry import Reference, Registry

IMAGE_SCHEMA = "thaw.image/v1"
# docker save blobs below this size are kept in memory (configs, small layers);
# larger ones are streamed straight through the layer reader.
_SMALL_BLOB_BYTES = 1 << 20


@dataclass(frozen=True)
class ImageConfig:
    env: tuple[str, ...] = ()
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    working_dir: str = ""
    user: str = ""


@dataclass(frozen=True)
class Image:
    layers: tuple[str, ...]
    config: ImageConfig = ImageConfig()
    annotations: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> bytes:
        c = self.config
        doc = {
            "schema": IMAGE_SCHEMA,
            "layers": list(self.layers),
            "config": {
                "env": list(c.env),
                "entrypoint": list(c.entrypoint),
                "cmd": list(c.cmd),
                "working_dir": c.working_dir,
                "user": c.user,
            },
            "annotations": dict(self.annotations),
        }
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @property
    def digest(self) -> str:
        return digest_bytes(self.to_json())

    @classmethod
    def from_json(cls, data: bytes) -> Image:
        try:
            doc = parse_json_object(data, "image", error=IntegrityError)
            if doc.get("schema") != IMAGE_SCHEMA:
                raise IntegrityError(f"unsupported image schema {doc.get('schema')!r}")
            layers = tuple(str(d) for d in doc["layers"])
            if not all(is_digest(d) for d in layers):
                raise IntegrityError("image names a layer that is not a digest")
            c = doc["config"]
            config = ImageConfig(
                env=tuple(c["env"]), entrypoint=tuple(c["entrypoint"]), cmd=tuple(c["cmd"]),
                working_dir=str(c["working_dir"]), user=str(c["user"]),
            )  # fmt: skip
            notes = {str(k): str(v) for k, v in doc.get("annotations", {}).items()}
            return cls(layers, config, notes)
        except IntegrityError:
            raise
        except (ValueError, KeyError, TypeError) as exc:
            raise IntegrityError(f"image document is malformed: {exc!r}") from None


# --- storage -------------------------------------------------------------------
def put_image(registry: Registry, image: Image) -> str:
    data = image.to_json()
    digest = digest_bytes(data)
    registry.store.put(f"images/{hex_part(digest)}", data)
    return digest


def get_image(registry: Registry, digest: str) -> Image:
    try:
        data = registry.store.get(f"images/{hex_part(digest)}")
    except NotFoundError:
        raise NotFoundError(f"image {digest} is not in store {registry.store.url}") from None
    if digest_bytes(data) != digest:
        raise IntegrityError(f"image {digest} in store {registry.store.url} is corrupt")
    return Image.from_json(data)


def image_reference(ref: str) -> Reference:
    """``IMAGE[:TAG]`` as a thaw reference; a docker-style ``name:tag`` works as is."""
    r = Reference.parse(ref)
    if r.digest:
        raise InvalidReferenceError(f"an image tag needs NAME:TAG, not a digest ({ref})")
    return r


def set_image_tag(registry: Registry, ref: str, digest: str) -> None:
    r = image_reference(ref)
    registry.store.put(f"image-tags/{r.name}/{r.tag}", digest.encode())


def resolve_image(registry: Registry, ref: str) -> str:
    """The image digest ``ref`` (NAME:TAG or a digest) names. Raises ``NotFoundError``."""
    if is_digest(ref):
        return ref
    r = image_reference(ref)
    try:
        digest = registry.store.get(f"image-tags/{r.name}/{r.tag}").decode().strip()
    except NotFoundError:
        raise NotFoundError(
            f"image {r} is not in store {registry.store.url}; push it with `thaw images push {r}`"
        ) from None
    if not is_digest(digest):
        raise IntegrityError(f"image tag {r} in store {registry.store.url} holds {digest!r}")
    return digest


# --- merging (pure) ------------------------------------------------------------
def merge_layers(layers: Iterable[LayerToc]) -> dict[str, TocEntry]:
    """The merged tree: path → entry, bottom layer first, whiteouts applied.

    Within a layer, whiteouts and opaque markers hide only lower layers'
    entries. A non-directory replacing a directory hides what was below it;
    parents that no layer lists are synthesised as ``0755`` directories, so
    every entry's parent exists and is a directory.
    """
    merged: dict[str, TocEntry] = {}
    for layer in layers:
        for e in layer.entries:
            if e.type == "opaque":
                _remove_below(merged, e.path)
            elif e.type == "whiteout":
                hidden = merged.pop(e.path, None)
                if hidden is not None and hidden.type == "dir":
                    _remove_below(merged, e.path)
        for e in layer.entries:
            if e.type in ("opaque", "whiteout"):
                continue
            _ensure_parents(merged, e.path)
            below = merged.get(e.path)
            if e.type != "dir" and below is not None and below.type == "dir":
                _remove_below(merged, e.path)  # O(n), but only when a file replaces a dir
            merged[e.path] = e
    return merged


def _remove_below(merged: dict[str, TocEntry], path: str) -> None:
    prefix = path + "/" if path else ""
    for p in [p for p in merged if p.startswith(prefix)]:
        del merged[p]


def _ensure_parents(merged: dict[str, TocEntry], path: str) -> None:
    parent = posixpath.dirname(path)
    missing = []
    while parent and (parent not in merged or merged[parent].type != "dir"):
        missing.append(parent)
        parent = posixpath.dirname(parent)
    for p in reversed(missing):
        if p in merged:  # a file or link where a directory is now needed
            _remove_below(merged, p)
        merged[p] = TocEntry(path=p, type="dir", mode=0o755)


# --- push from `docker save` ---------------------------------------------------
@dataclass(frozen=True)
class ImagePushResult:
    ref: str
    digest: str
    layers: tuple[str, ...]
    files: int
    content_bytes: int
    new_stored_bytes: int
    chunks_new: int
    chunks_deduplicated: int


def push_image_archive(
    stream: IO[bytes],
    ref: str,
    registry: Registry,
    *,
    chunk_size_bytes: int = DEFAULT_CHUNK_SIZE_BYTES,
    progress: Callable[[LayerProgress], None] | None = None,
    annotations: dict[str, str] | None = None,
) -> ImagePushResult:
    """Push the first image of a ``docker save`` stream and tag it ``ref``.

    Raises ``BadArtifactError`` naming the refused entry (no image document or
    tag is written; already-uploaded chunks stay, unreferenced).
    """
    reference = image_reference(ref)
    with LeaseKeeper(registry.store, f"push image {reference}") as lease:
        sink = ChunkSink(registry, progress, lease=lease)
        tocs, small = _read_archive(stream, sink, chunk_size_bytes)
        manifest = _docker_manifest(small)
        layer_paths = [str(p) for p in manifest.get("Layers", [])]
        ordered = [_layer_for(p, tocs, small, sink, chunk_size_bytes) for p in layer_paths]
        config = _image_config(small, str(manifest.get("Config", "")))
        image = Image(tuple(t.digest for t in ordered), config, dict(annotations or {}))
        lease.protect(manifests=[*image.layers, image.digest])  # any kind: see snapshotter.gc
        digests = tuple(put_layer(registry, toc) for toc in ordered)
        confirm_stored(lease, sink.found, registry.has_chunk, registry.store.url)
        digest = put_image(registry, image)
        set_image_tag(registry, str(reference), digest)
    merged = merge_layers(ordered)
    return ImagePushResult(
        ref=str(reference),
        digest=digest,
        layers=digests,
        files=sum(1 for e in merged.values() if e.has_content),
        content_bytes=sum(e.size for e in merged.values() if e.type == "file"),
        new_stored_bytes=sink.new_stored_bytes,
        chunks_new=sink.chunks_new,
        chunks_deduplicated=sink.chunks_deduplicated,
    )


def _read_archive(
    stream: IO[bytes], sink: ChunkSink, chunk_size_bytes: int
) -> tuple[dict[str, LayerToc | BaseException], dict[str, bytes | str]]:
    """One pass: large blobs become TOCs, small ones stay as bytes, links as targets."""
    tocs: dict[str, LayerToc | BaseException] = {}
    small: dict[str, bytes | str] = {}
    try:
        with tarfile.open(fileobj=stream, mode="r|*") as outer:
            for member in outer:
                name = posixpath.normpath(member.name)
                if member.issym() or member.islnk():
                    base = posixpath.dirname(name) if member.issym() else ""
                    small[name] = posixpath.normpath(posixpath.join(base, member.linkname))
                elif member.isreg() and member.size < _SMALL_BLOB_BYTES:
                    handle = outer.extractfile(member)
                    small[name] = handle.read() if handle else b""
                elif member.isreg():
                    tocs[name] = _try_layer(outer, member, sink, chunk_size_bytes)
    except tarfile.TarError as exc:
        raise BadArtifactError(f"not a `docker save` archive: {exc}") from None
    return tocs, small


def _try_layer(
    outer: tarfile.TarFile, member: tarfile.TarInfo, sink: ChunkSink, chunk_size_bytes: int
) -> LayerToc | BaseException:
    handle = outer.extractfile(member)
    if handle is None:
        return BadArtifactError(f"{member.name} in the archive has no content")
    try:
        return read_layer(handle, sink, chunk_size_bytes=chunk_size_bytes)
    except BadArtifactError as exc:
        # A refused entry is fatal only if the image uses this blob (decided later).
        return BadArtifactError(f"layer {member.name}: {exc}")


def _layer_for(
    path: str,
    tocs: dict[str, LayerToc | BaseException],
    small: dict[str, bytes | str],
    sink: ChunkSink,
    chunk_size_bytes: int,
) -> LayerToc:
    name = posixpath.normpath(path)
    for _ in range(8):  # docker save links repeated layers to their first copy
        target = small.get(name)
        if not isinstance(target, str):
            break
        name = target
    found = tocs.get(name)
    if isinstance(found, LayerToc):
        return found
    if isinstance(found, BaseException):
        raise found
    data = small.get(name)
    if not isinstance(data, bytes):
        raise BadArtifactError(f"the archive's manifest.json names layer {path}, which is absent")
    try:
        return read_layer(io.BytesIO(data), sink, chunk_size_bytes=chunk_size_bytes)
    except BadArtifactError as exc:
        raise BadArtifactError(f"layer {path}: {exc}") from None


def _docker_manifest(small: dict[str, bytes | str]) -> dict[str, Any]:
    data = small.get("manifest.json")
    if not isinstance(data, bytes):
        raise BadArtifactError("not a `docker save` archive: it has no manifest.json")
    doc = parse_json(data, "manifest.json of the archive")
    if not isinstance(doc, list) or not doc or not isinstance(doc[0], dict):
        raise BadArtifactError("manifest.json of the archive lists no image")
    return doc[0]


def _image_config(small: dict[str, bytes | str], path: str) -> ImageConfig:
    data = small.get(posixpath.normpath(path)) if path else None
    if not isinstance(data, bytes):
        return ImageConfig()
    c = parse_json_object(data, f"image config {path}").get("config") or {}
    return ImageConfig(
        env=tuple(c.get("Env") or ()),
        entrypoint=tuple(c.get("Entrypoint") or ()),
        cmd=tuple(c.get("Cmd") or ()),
        working_dir=str(c.get("WorkingDir") or ""),
        user=str(c.get("User") or ""),
    )


def image_layers(registry: Registry, image: Image) -> Sequence[LayerToc]:
    """The image's layer TOCs, bottom first, each verified against its digest."""
    return [get_layer(registry, d) for d in image.layers]
