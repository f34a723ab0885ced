"""Functions and their versions: deploy, show, list, delete, roll back.

A deploy checks everything before it writes: the model and adapters resolve
in the store with the right kind (else 400 naming the missing one), the
bundle exists, and its entry imports (``services.bundles``). Only then is a
new version stored and made active, so a bad deploy never replaces a
serving version. Replicas of older versions are drained by the reconciler.
A deploy with a canary share stores the version as the function's canary
instead (``services.canary``); a plain deploy or a rollback ends any canary.
A deploy that repeats the serving version (same spec, code bundle digest,
model and adapter digests) makes no new version: ``thaw up`` and CI pipelines
deploy on every start, and a new version would move calls and drain warm
replicas for nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete as sql_delete
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from control_plane.db.models import Call, Canary, Function, FunctionVersion
from control_plane.errors import BadRequestError, NotFoundError
from control_plane.services import function_health
from control_plane.services.bundles import BundleValidator, EntryTraits
from control_plane.services.function_health import FunctionHealth
from control_plane.services.states import NON_FINAL_CALL_STATES
from control_plane.spec import FunctionSpec
from snapshotter import pins
from snapshotter.errors import NotFoundError as StoreNotFound
from snapshotter.errors import SnapshotterError
from snapshotter.images import resolve_image
from snapshotter.manifest import ArtifactKind
from snapshotter.registry import Registry


@dataclass(frozen=True)
class ResolvedAdapter:
    name: str
    ref: str
    digest: str


@dataclass(frozen=True)
class ActiveVersion:
    """What the scheduler and dispatcher need of a function's live version."""

    name: str
    version: int
    spec: FunctionSpec
    model_digest: str | None
    adapters: list[ResolvedAdapter]
    # The class defines load_adapter (None: a version deployed before this was kept).
    loads_adapters: bool | None = None


@dataclass(frozen=True)
class FunctionInfo:
    name: str
    version: int | None
    versions: list[int]
    spec: dict[str, Any] | None
    model_digest: str | None
    created_at: float
    canary: CanaryInfo | None = None  # a version taking a share of calls beside it
    health: FunctionHealth = function_health.OK  # from its active version's replica starts


@dataclass(frozen=True)
class CanaryInfo:
    version: int
    weight_pct: float
    started_at: float


def _resolve(registry: Registry, ref: str, kind: ArtifactKind, what: str) -> str:
    try:
        digest = registry.resolve(ref)
        manifest = registry.get_manifest(digest)
    except StoreNotFound:
        url = registry.store.url
        raise BadRequestError(
            f"{what} {ref} is not in the store {url} (the control plane's); push it there "
            f"with `thaw models push DIR {ref} --store {url}`"
        ) from None
    except SnapshotterError as exc:
        raise BadRequestError(f"{what} {ref}: {exc}") from None
    if manifest.kind != kind:
        raise BadRequestError(f"{what} {ref} is a {manifest.kind.value}, not a {kind.value}")
    return digest


def deploy(
    session: Session,
    registry: Registry,
    validate: BundleValidator,
    spec: FunctionSpec,
    now: float,
    canary_pct: float | None = None,
) -> FunctionInfo:
    """Check ``spec`` fully, then store it as the function's new active version.

    With ``canary_pct`` the new version becomes the function's canary instead
    (``services.canary``): it takes that share of calls, the active version the rest.
    """
    model_digest = None
    if spec.model:
        model_digest = _resolve(registry, spec.model, ArtifactKind.MODEL, "model")
    adapters = [
        ResolvedAdapter(a.name, a.ref, _resolve(registry, a.ref, ArtifactKind.ADAPTER, "adapter"))
        for a in spec.adapters
    ]
    bundle_digest = _resolve(registry, spec.bundle, ArtifactKind.BUNDLE, "code bundle")
    # An LLM function's entry is thaw's own: nothing of the bundle's to import.
    traits = (
        EntryTraits(loads_adapters=True)
        if spec.llm
        else validate(registry, spec.bundle, spec.entry)
    )
    fn = session.scalars(select(Function).where(Function.name == spec.name)).first()
    if canary_pct is not None and (fn is None or fn.active_version is None):
        raise BadRequestError(
            f"function {spec.name} has no active version for a canary to be compared with; "
            "deploy it once without --canary"
        )
    if fn is None:
        fn = Function(name=spec.name, created_at=now)
        session.add(fn)
        session.flush()
    stored = _Stored(
        spec.model_dump_json(), model_digest, json.dumps([a.__dict__ for a in adapters])
    )
    same = _unchanged(session, fn, stored, spec.bundle == bundle_digest, canary_pct)
    if same is not None:
        return _keep(session, fn, same, canary_pct)
    latest = session.scalar(
        select(func.max(FunctionVersion.version)).where(FunctionVersion.function_id == fn.id)
    )
    version = (latest or 0) + 1
    session.add(
        FunctionVersion(
            function_id=fn.id,
            version=version,
            spec_json=stored.spec_json,
            model_digest=stored.model_digest,
            adapters_json=stored.adapters_json,
            created_at=now,
            loads_adapters=traits.loads_adapters,
        )
    )
    if canary_pct is None:
        fn.active_version = version
        session.execute(sql_delete(Canary).where(Canary.function_id == fn.id))
    else:
        session.merge(
            Canary(function_id=fn.id, version=version, weight_pct=canary_pct, started_at=now)
        )
    session.flush()
    used = [bundle_digest, *([model_digest] if model_digest else []), *(a.digest for a in adapters)]
    pins.pin(registry.store, pins.function_owner(spec.name, version), used + _image(registry, spec))
    return show(session, spec.name)


@dataclass(frozen=True)
class _Stored:
    """What a version row holds of a deploy: equal ones run the same code the same way."""

    spec_json: str
    model_digest: str | None
    adapters_json: str


def _unchanged(
    session: Session, fn: Function, stored: _Stored, bundle_pinned: bool, canary_pct: float | None
) -> int | None:
    """The version a deploy would only repeat: the active one for a plain deploy, the
    canary for a canary deploy, when its spec (code bundle digest included), model and
    adapters digests are the same. None: a new version. A bundle named by tag, not by
    digest, is always new (what the tag named before is not known)."""
    if not bundle_pinned:
        return None
    row_canary = session.get(Canary, fn.id)
    current = fn.active_version if canary_pct is None else getattr(row_canary, "version", None)
    if current is None:
        return None
    row = _version_row(session, fn, current)
    same = _Stored(row.spec_json, row.model_digest, row.adapters_json) == stored
    return current if same else None


def _keep(session: Session, fn: Function, version: int, canary_pct: float | None) -> FunctionInfo:
    """A repeated deploy: no new version. A plain one still ends any canary; a canary
    one takes the new share."""
    if canary_pct is None:
        session.execute(sql_delete(Canary).where(Canary.function_id == fn.id))
    else:
        row_canary = session.get(Canary, fn.id)
        assert row_canary is not None  # _unchanged found the canary
        row_canary.weight_pct = canary_pct
    session.flush()
    return show(session, fn.name)


def _image(registry: Registry, spec: FunctionSpec) -> list[str]:
    """The image digest a docker function runs on, when it resolves (it is checked at start)."""
    if not spec.image:
        return []
    try:
        return [resolve_image(registry, spec.image)]
    except SnapshotterError:
        return []


def _get(session: Session, name: str) -> Function:
    fn = session.scalars(select(Function).where(Function.name == name)).first()
    if fn is None:
        raise NotFoundError(f"no function {name!r}; deploy it with `thaw deploy DIR`")
    return fn


def _version_row(session: Session, fn: Function | FunctionKey, version: int) -> FunctionVersion:
    row = session.scalars(
        select(FunctionVersion).where(
            FunctionVersion.function_id == fn.id, FunctionVersion.version == version
        )
    ).first()
    if row is None:
        raise NotFoundError(f"function {fn.name} has no version {version}")
    return row


def active(session: Session, name: str) -> ActiveVersion:
    """The live version of ``name``. Raises ``NotFoundError``."""
    return active_of(session, _get(session, name))


def active_of(session: Session, fn: Function) -> ActiveVersion:
    """The live version of ``fn``. Raises ``NotFoundError``."""
    if fn.active_version is None:
        raise NotFoundError(f"function {fn.name} has no active version; deploy it")
    return version_of(session, fn, fn.active_version)


def version_of(session: Session, fn: Function | FunctionKey, version: int) -> ActiveVersion:
    """Version ``version`` of ``fn`` as the scheduler and dispatcher need it."""
    row = _version_row(session, fn, version)
    adapters = [ResolvedAdapter(**a) for a in json.loads(row.adapters_json)]
    spec = FunctionSpec.model_validate_json(row.spec_json)
    return ActiveVersion(fn.name, row.version, spec, row.model_digest, adapters, row.loads_adapters)


@dataclass(frozen=True)
class FunctionKey:
    """Which function, exactly: a function deleted and deployed again under the same
    name is another one (its ``created_at``, and on PostgreSQL its id, differ)."""

    id: int
    created_at: float
    name: str


class VersionCache:
    """Versions already read (``version_of``), by ``FunctionKey`` and version number.
    A deployed version never changes, so an entry never goes stale. One per database."""

    MAX_ENTRIES = 1024

    def __init__(self) -> None:
        self._versions: dict[tuple[FunctionKey, int], ActiveVersion] = {}

    def version_of(self, session: Session, fn: FunctionKey, version: int) -> ActiveVersion:
        hit = self._versions.get((fn, version))
        if hit is None:
            hit = version_of(session, fn, version)
            if len(self._versions) >= self.MAX_ENTRIES:
                self._versions.clear()
            self._versions[(fn, version)] = hit
        return hit


def show(session: Session, name: str) -> FunctionInfo:
    fn = _get(session, name)
    versions = list(
        session.scalars(
            select(FunctionVersion.version)
            .where(FunctionVersion.function_id == fn.id)
            .order_by(FunctionVersion.version)
        )
    )
    spec = None
    model_digest = None
    if fn.active_version is not None:
        row = _version_row(session, fn, fn.active_version)
        spec, model_digest = json.loads(row.spec_json), row.model_digest
    row_canary = session.get(Canary, fn.id)
    canary = (
        None
        if row_canary is None
        else CanaryInfo(row_canary.version, row_canary.weight_pct, row_canary.started_at)
    )
    health = function_health.of(session, fn.name, fn.active_version)
    return FunctionInfo(
        fn.name, fn.active_version, versions, spec, model_digest, fn.created_at, canary, health
    )


def list_functions(session: Session) -> list[FunctionInfo]:
    names = session.scalars(select(Function.name).order_by(Function.name)).all()
    return [show(session, n) for n in names]


def names(session: Session) -> list[str]:
    return list(session.scalars(select(Function.name).order_by(Function.name)))


def delete(session: Session, registry: Registry, name: str, now: float) -> list[str]:
    """Remove the function and its versions (and their pins: ``thaw gc`` may then
    collect what only they used); its unfinished calls end cancelled.

    Returns the ids of the calls it cancelled (their waiters need waking).
    """
    fn = _get(session, name)
    call_ids = list(
        session.scalars(
            select(Call.id).where(Call.function == name, Call.status.in_(NON_FINAL_CALL_STATES))
        )
    )
    session.execute(
        update(Call)
        .where(Call.function == name, Call.status.in_(NON_FINAL_CALL_STATES))
        .values(status="cancelled", error="function deleted", finished_at=now, cancel_pending=True)
    )
    session.delete(fn)
    session.flush()
    pins.unpin(registry.store, pins.function_owner(name))
    return call_ids


def rollback(session: Session, name: str, version: int | None) -> FunctionInfo:
    """Make ``version`` (default: the one before the active one) active again."""
    fn = _get(session, name)
    if version is None:
        older = [v for v in show(session, name).versions if v < (fn.active_version or 0)]
        if not older:
            raise BadRequestError(f"function {name} has no version before {fn.active_version}")
        version = older[-1]
    _version_row(session, fn, version)
    fn.active_version = version
    session.execute(sql_delete(Canary).where(Canary.function_id == fn.id))  # back to one version
    session.flush()
    return show(session, name)


def functions_using(session: Session, ref: str) -> list[str]:
    """Functions whose active version names ``ref`` as model or adapter."""
    rows = session.execute(
        select(Function.name, FunctionVersion.spec_json).join(
            FunctionVersion,
            (FunctionVersion.function_id == Function.id)
            & (FunctionVersion.version == Function.active_version),
        )
    ).all()
    out = []
    for name, spec_json in rows:
        spec = FunctionSpec.model_validate_json(spec_json)
        if spec.model == ref or any(a.ref == ref for a in spec.adapters):
            out.append(name)
    return sorted(out)
