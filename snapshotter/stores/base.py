"""The one interface every store implements: named blobs, atomically written.

Keys are ``/``-separated relative names (no ``..``, no leading ``/``). The
layout above this interface (see ``snapshotter.registry``)::

    chunks/<hex[:2]>/<hex>      a framed chunk (``snapshotter.codec``)
    manifests/<hex>             a manifest's canonical JSON
    tags/<name>/<tag>           the digest a NAME:TAG points at, as text
    profiles/<hex>              a manifest's recorded prefetch order (JSON)
    layers/<hex>, images/<hex>  container layer TOCs and images (``snapshotter.images``)
    image-tags/<name>/<tag>     the digest an image NAME:TAG points at
    leases/<id>.json            what a push or load in progress protects (``snapshotter.leases``)
    gc/plans/<id>.json          a garbage collection's plan (``snapshotter.gc``)

A reader never sees a partial object: ``put`` is all or nothing.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from dataclasses import dataclass

from snapshotter.errors import StoreError


def check_key(key: str) -> str:
    """Refuse keys that could escape the store's root."""
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"invalid store key {key!r}")
    return key


@dataclass(frozen=True)
class ObjectInfo:
    """One stored object as a listing sees it (garbage collection reads ages)."""

    key: str
    size_bytes: int
    modified_s: float  # seconds since the epoch


class Store(abc.ABC):
    """A flat namespace of immutable-by-convention blobs."""

    url: str

    @abc.abstractmethod
    def get(self, key: str) -> bytes:
        """The whole object. Raises ``NotFoundError`` when absent."""

    @abc.abstractmethod
    def put(self, key: str, data: bytes | memoryview) -> None:
        """Write atomically, replacing any object of that key."""

    @abc.abstractmethod
    def exists(self, key: str) -> bool: ...

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove; absent keys are not an error."""

    @abc.abstractmethod
    def list(self, prefix: str) -> Iterator[str]:
        """Keys under ``prefix`` (a folder-like prefix ending in ``/``), any order."""

    def list_info(self, prefix: str) -> Iterator[ObjectInfo]:
        """Keys under ``prefix`` with size and last-modified time, any order.

        Stores that cannot tell an object's age raise ``StoreError`` (GC needs it).
        """
        raise StoreError(f"store {self.url} cannot list object ages; garbage collection needs them")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url}>"
