"""Artifacts in a store: chunks, manifests, tags and prefetch profiles.

Tags work the way a container registry keeps them: ``tags/<name>/<tag>``
holds the manifest digest as text. Names are lowercase path-like words
(``llama-tiny``, ``team/llama``); tags are ``[A-Za-z0-9_.-]{1,128}``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass

from snapshotter.digest import digest_bytes, hex_part, is_digest
from snapshotter.errors import IntegrityError, InvalidReferenceError, NotFoundError
from snapshotter.json_doc import parse_json_object
from snapshotter.manifest import Manifest
from snapshotter.stores.base import Store

_NAME_RE = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*$")
_TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
DEFAULT_TAG = "latest"


@dataclass(frozen=True)
class Reference:
    """``NAME:TAG`` or a bare manifest digest."""

    name: str | None
    tag: str | None
    digest: str | None = None

    @classmethod
    def parse(cls, text: str) -> Reference:
        if is_digest(text):
            return cls(name=None, tag=None, digest=text)
        name, _, tag = text.rpartition(":") if ":" in text else (text, "", DEFAULT_TAG)
        if not _NAME_RE.match(name):
            raise InvalidReferenceError(
                f"invalid artifact name {name!r}: use lowercase letters, digits, '.', '_', '-' "
                "and '/' (e.g. llama-tiny:v1)"
            )
        if not _TAG_RE.match(tag):
            raise InvalidReferenceError(f"invalid tag {tag!r} in {text!r}")
        return cls(name=name, tag=tag)

    def __str__(self) -> str:
        return self.digest if self.digest else f"{self.name}:{self.tag}"


@dataclass(frozen=True)
class TagEntry:
    name: str
    tag: str
    digest: str

    @property
    def ref(self) -> str:
        return f"{self.name}:{self.tag}"


def chunk_key(digest: str) -> str:
    h = hex_part(digest)
    return f"chunks/{h[:2]}/{h}"


class Registry:
    """Typed access to one store. Thread-safe as far as the store is."""

    def __init__(self, store: Store) -> None:
        self.store = store

    # --- chunks ------------------------------------------------------------
    def has_chunk(self, digest: str) -> bool:
        return self.store.exists(chunk_key(digest))

    def put_chunk(self, digest: str, framed: bytes | memoryview) -> None:
        self.store.put(chunk_key(digest), framed)

    def get_chunk(self, digest: str) -> bytes:
        """The framed object; the caller verifies it (see ``codec``)."""
        return self.store.get(chunk_key(digest))

    def chunk_digests(self) -> Iterator[str]:
        for key in self.store.list("chunks/"):
            yield "blake3:" + key.rsplit("/", 1)[1]

    # --- manifests ---------------------------------------------------------
    def put_manifest(self, manifest: Manifest) -> str:
        data = manifest.to_json()
        digest = digest_bytes(data)
        self.store.put(f"manifests/{hex_part(digest)}", data)
        return digest

    def get_manifest(self, digest: str) -> Manifest:
        try:
            data = self.store.get(f"manifests/{hex_part(digest)}")
        except NotFoundError:
            raise NotFoundError(f"manifest {digest} is not in store {self.store.url}") from None
        if digest_bytes(data) != digest:
            raise IntegrityError(f"manifest {digest} in store {self.store.url} is corrupt")
        return Manifest.from_json(data)

    def manifest_digests(self) -> Iterator[str]:
        for key in self.store.list("manifests/"):
            yield "blake3:" + key.rsplit("/", 1)[1]

    # --- tags --------------------------------------------------------------
    def set_tag(self, ref: str | Reference, digest: str) -> None:
        r = ref if isinstance(ref, Reference) else Reference.parse(ref)
        if r.digest:
            raise InvalidReferenceError(f"cannot tag a digest; give NAME:TAG, not {r}")
        self.store.put(f"tags/{r.name}/{r.tag}", digest.encode())

    def delete_tag(self, ref: str | Reference) -> None:
        r = ref if isinstance(ref, Reference) else Reference.parse(ref)
        self.store.delete(f"tags/{r.name}/{r.tag}")

    def resolve(self, ref: str | Reference) -> str:
        """The manifest digest a reference names. Raises ``NotFoundError``."""
        r = ref if isinstance(ref, Reference) else Reference.parse(ref)
        if r.digest:
            return r.digest
        try:
            digest = self.store.get(f"tags/{r.name}/{r.tag}").decode().strip()
        except NotFoundError:
            raise NotFoundError(
                f"{r} is not in store {self.store.url}; push it with `thaw models push DIR {r}`"
            ) from None
        if not is_digest(digest):
            raise IntegrityError(f"tag {r} in store {self.store.url} holds {digest!r}")
        return digest

    def tags(self) -> list[TagEntry]:
        out = []
        for key in self.store.list("tags/"):
            name, tag = key[len("tags/") :].rsplit("/", 1)
            out.append(TagEntry(name, tag, self.store.get(key).decode().strip()))
        return sorted(out, key=lambda e: (e.name, e.tag))

    # --- prefetch profiles -------------------------------------------------
    def put_profile(self, digest: str, order: list[str]) -> None:
        """Record the order items (tensor or file names) were first touched."""
        self.store.put(f"profiles/{hex_part(digest)}", json.dumps({"order": order}).encode())

    def get_profile(self, digest: str) -> list[str] | None:
        try:
            data = self.store.get(f"profiles/{hex_part(digest)}")
        except NotFoundError:
            return None
        doc = parse_json_object(data, f"prefetch profile of {digest}", error=IntegrityError)
        order = doc.get("order")
        return [str(x) for x in order] if isinstance(order, list) else None
