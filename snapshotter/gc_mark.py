"""Garbage collection's decisions, as pure functions: what is live, what may go.

Every reference an object in the store can make::

    tags/<name>/<tag>        ─▶ manifest (model, adapter, code bundle)
    image-tags/<name>/<tag>  ─▶ image ─▶ layer TOCs
    lease (unexpired)        ─▶ manifests, images, layers (by digest) and chunks
    manifest                 ─▶ chunks (of every file)
    layer TOC                ─▶ chunks (of every file and hard link)
    profiles/<hex>           ◀─ keyed by a manifest or image digest: live with it

``mark`` walks from the roots through a ``Graph`` (the documents, read by
``snapshotter.gc`` or given by a test) and returns the live digests;
``plan_sweep`` picks, from a listing of the store, the objects that are
neither live nor younger than the grace period. Tags, leases, plans and keys
of any other shape are never chosen.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from snapshotter.digest import is_digest
from snapshotter.images import Image
from snapshotter.layers import LayerToc
from snapshotter.manifest import Manifest
from snapshotter.stores.base import ObjectInfo

# key prefix → kind of the digest-named object stored there
_DOCUMENT_PREFIXES = {
    "manifests/": "manifest",
    "images/": "image",
    "layers/": "layer",
    "profiles/": "profile",
}


@dataclass(frozen=True)
class Roots:
    """Digests something points at directly: tags and unexpired leases."""

    manifests: frozenset[str] = frozenset()
    images: frozenset[str] = frozenset()
    layers: frozenset[str] = frozenset()
    chunks: frozenset[str] = frozenset()

    def __sub__(self, other: Roots) -> Roots:
        return Roots(
            self.manifests - other.manifests,
            self.images - other.images,
            self.layers - other.layers,
            self.chunks - other.chunks,
        )

    def __bool__(self) -> bool:
        return bool(self.manifests or self.images or self.layers or self.chunks)


@dataclass
class Live:
    """Digests that must stay, by kind (a profile is live with its manifest or image)."""

    manifests: set[str] = field(default_factory=set)
    images: set[str] = field(default_factory=set)
    layers: set[str] = field(default_factory=set)
    chunks: set[str] = field(default_factory=set)

    def update(self, other: Live) -> None:
        self.manifests |= other.manifests
        self.images |= other.images
        self.layers |= other.layers
        self.chunks |= other.chunks

    def holds(self, kind: str, digest: str) -> bool:
        if kind == "chunk":
            return digest in self.chunks
        if kind == "manifest":
            return digest in self.manifests
        if kind == "image":
            return digest in self.images
        if kind == "layer":
            return digest in self.layers
        return digest in self.manifests or digest in self.images  # a profile


class Graph(Protocol):
    """The documents roots lead to. Each returns None when the document is absent
    (a tag or lease naming something not yet, or no longer, stored) and raises
    when it is present but unreadable: GC must then stop, not guess."""

    def manifest(self, digest: str) -> Manifest | None: ...

    def image(self, digest: str) -> Image | None: ...

    def layer(self, digest: str) -> LayerToc | None: ...


def mark(roots: Roots, graph: Graph) -> Live:
    """Every digest reachable from ``roots``; roots themselves are live even when absent."""
    live = Live(
        manifests=set(roots.manifests),
        images=set(roots.images),
        layers=set(roots.layers),
        chunks=set(roots.chunks),
    )
    for digest in roots.images:
        image = graph.image(digest)
        if image is not None:
            live.layers.update(image.layers)
    for digest in live.manifests:
        manifest = graph.manifest(digest)
        if manifest is not None:
            live.chunks.update(manifest.unique_chunks())
    for digest in live.layers:
        toc = graph.layer(digest)
        if toc is not None:
            live.chunks.update(c.digest for e in toc.entries for c in e.chunks)
    return live


def classify(key: str) -> tuple[str, str] | None:
    """``(kind, digest)`` of a digest-named object; None for keys GC never deletes."""
    if key.startswith("chunks/"):
        parts = key.split("/")
        digest = "blake3:" + parts[-1]
        if len(parts) == 3 and is_digest(digest) and parts[1] == parts[2][:2]:
            return "chunk", digest
        return None
    for prefix, kind in _DOCUMENT_PREFIXES.items():
        if key.startswith(prefix):
            digest = "blake3:" + key[len(prefix) :]
            return (kind, digest) if is_digest(digest) else None
    return None


def plan_sweep(
    objects: Iterable[ObjectInfo], live: Live, now_s: float, grace_s: float
) -> list[ObjectInfo]:
    """Objects to delete: digest-named, not live, last modified at least ``grace_s`` ago.

    Sorted by key, so a plan reads the same however the store listed it.
    """
    doomed = []
    for obj in objects:
        named = classify(obj.key)
        if named is None or live.holds(*named):
            continue
        if now_s - obj.modified_s < grace_s:
            continue
        doomed.append(obj)
    return sorted(doomed, key=lambda o: o.key)
