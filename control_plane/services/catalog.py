"""Models and adapters in the store, as the API lists them; deletion guarded by use."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session

from control_plane.errors import BadRequestError, ConflictError, NotFoundError
from control_plane.services import functions
from snapshotter.errors import NotFoundError as StoreNotFound
from snapshotter.errors import SnapshotterError
from snapshotter.manifest import ArtifactKind
from snapshotter.registry import Reference, Registry

LISTED_KINDS = (ArtifactKind.MODEL, ArtifactKind.ADAPTER)


@dataclass(frozen=True)
class ArtifactInfo:
    name: str
    tag: str
    kind: str
    digest: str
    raw_size_bytes: int
    stored_size_bytes: int
    files: int


def _parse(ref: str) -> Reference:
    try:
        r = Reference.parse(ref)
    except SnapshotterError as exc:
        raise BadRequestError(str(exc)) from None
    if r.digest:
        raise BadRequestError(f"give NAME:TAG, not a digest ({ref})")
    return r


def _info(registry: Registry, name: str, tag: str, digest: str) -> ArtifactInfo:
    m = registry.get_manifest(digest)
    return ArtifactInfo(name, tag, m.kind.value, digest, m.raw_size, m.stored_size, len(m.files))


def list_artifacts(registry: Registry) -> list[ArtifactInfo]:
    """Every tagged model and adapter (bundles and layers are not listed)."""
    out = []
    for e in registry.tags():
        info = _info(registry, e.name, e.tag, e.digest)
        if info.kind in LISTED_KINDS:
            out.append(info)
    return out


def show_artifact(registry: Registry, ref: str) -> ArtifactInfo:
    r = _parse(ref)
    try:
        digest = registry.resolve(r)
        return _info(registry, str(r.name), str(r.tag), digest)
    except StoreNotFound as exc:
        raise NotFoundError(str(exc)) from None


def delete_artifact(session: Session, registry: Registry, ref: str) -> ArtifactInfo:
    """Remove the tag; refuse (409, naming them) while a deployed function uses it."""
    info = show_artifact(registry, ref)
    users = functions.functions_using(session, f"{info.name}:{info.tag}")
    if users:
        raise ConflictError(
            f"{info.name}:{info.tag} is used by deployed function(s) {', '.join(users)}; "
            "delete or redeploy them first"
        )
    registry.delete_tag(f"{info.name}:{info.tag}")
    return info


def resolve_adapter(registry: Registry, ref: str) -> str:
    """The manifest digest of adapter ``ref`` (``NAME:TAG``) in the store.

    Raises ``BadRequestError`` naming ``ref`` when the store lacks it or it is
    not an adapter.
    """
    try:
        digest = registry.resolve(ref)
        manifest = registry.get_manifest(digest)
    except StoreNotFound:
        url = registry.store.url
        raise BadRequestError(
            f"adapter {ref!r} is not in the store {url} (the control plane's); push it there "
            f"with `thaw models push DIR {ref} --store {url}`"
        ) from None
    except SnapshotterError as exc:
        raise BadRequestError(f"adapter {ref!r}: {exc}") from None
    if manifest.kind != ArtifactKind.ADAPTER:
        raise BadRequestError(f"{ref!r} is a {manifest.kind.value}, not a LoRA adapter")
    return digest
