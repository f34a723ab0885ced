"""Models and adapters with what they cost in the store and who uses them.

For each tagged model or adapter:

    raw_size_bytes       the files' bytes
    stored_size_bytes    its distinct chunks as stored (compressed where it paid)
    shared_stored_bytes  of those, the stored bytes of chunks that some other
                         tagged artifact also holds: stored once, counted in
                         both, so deleting this artifact would not free them
    used_by              functions whose active version names it

``dedup_summary`` is pure: it takes the chunk sets and returns the shared
bytes, so the arithmetic is tested without a store.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy.orm import Session

from control_plane.services import functions
from control_plane.services.catalog import LISTED_KINDS
from snapshotter.registry import Registry


@dataclass(frozen=True)
class ArtifactUsage:
    name: str
    tag: str
    kind: str
    digest: str
    files: int
    raw_size_bytes: int
    stored_size_bytes: int
    shared_stored_bytes: int
    used_by: list[str]


def dedup_summary(chunks_by_digest: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
    """Per manifest digest: stored bytes of its chunks that another manifest also holds.

    ``chunks_by_digest`` maps a manifest digest to {chunk digest: stored bytes}.
    """
    holders = Counter(c for chunks in chunks_by_digest.values() for c in chunks)
    return {
        m: sum(size for c, size in chunks.items() if holders[c] > 1)
        for m, chunks in chunks_by_digest.items()
    }


def list_usage(session: Session, registry: Registry) -> list[ArtifactUsage]:
    """Every tagged model and adapter with sizes, sharing and users."""
    tagged = []
    chunks: dict[str, dict[str, int]] = {}
    for entry in registry.tags():
        manifest = registry.get_manifest(entry.digest)
        if manifest.kind not in LISTED_KINDS:
            continue
        tagged.append((entry, manifest))
        chunks[entry.digest] = {d: c.stored_size for d, c in manifest.unique_chunks().items()}
    shared = dedup_summary(chunks)
    return [
        ArtifactUsage(
            name=e.name,
            tag=e.tag,
            kind=m.kind.value,
            digest=e.digest,
            files=len(m.files),
            raw_size_bytes=m.raw_size,
            stored_size_bytes=m.stored_size,
            shared_stored_bytes=shared[e.digest],
            used_by=functions.functions_using(session, e.ref),
        )
        for e, m in tagged
    ]


def refs_by_digest(registry: Registry) -> dict[str, list[str]]:
    """Every tag's NAME:TAG, grouped by the manifest digest it points at."""
    out: dict[str, list[str]] = {}
    for e in registry.tags():
        out.setdefault(e.digest, []).append(e.ref)
    return out
