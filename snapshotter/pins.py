"""Pins: digests that deployed functions rely on, kept by ``thaw gc``.

    pins/<owner>/<digest hex>    holds the digest itself

A tag can move to a new digest while an older function version still runs on
the old one (replicas already started, a rollback). So the control plane pins
the model, adapters, code bundle and image of every version it deploys, under
the owner ``functions/<name>/<version>``, and removes the function's pins when
the function is deleted. Garbage collection reads every pin as a root
(``snapshotter.gc.read_roots``); a pin names a digest, not a kind, so
whichever kind exists under it is kept.
"""

from __future__ import annotations

from collections.abc import Iterable

from snapshotter.digest import hex_part
from snapshotter.stores.base import Store

PREFIX = "pins/"


def function_owner(name: str, version: int | None = None) -> str:
    """The owner of a function's pins (all its versions when ``version`` is None)."""
    return f"functions/{name}/" if version is None else f"functions/{name}/{version}"


def pin(store: Store, owner: str, digests: Iterable[str]) -> None:
    for digest in set(digests):
        store.put(f"{PREFIX}{owner}/{hex_part(digest)}", digest.encode())


def unpin(store: Store, owner_prefix: str) -> None:
    """Remove every pin whose owner starts with ``owner_prefix``."""
    for key in store.list(f"{PREFIX}{owner_prefix}"):
        store.delete(key)
