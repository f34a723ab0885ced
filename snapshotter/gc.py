"""Garbage collection of a store: mark from tags and leases, then sweep a written plan.

::

    read roots (tags, image tags, unexpired leases) ──▶ mark (snapshotter.gc_mark)
        ──▶ list every object with its age ──▶ plan: not live and older than the grace
        ──▶ write gc/plans/<id>.json ──▶ per batch: re-read roots, mark what is new,
            drop it from the batch, delete the rest ──▶ delete leases expired for longer
            than the grace ──▶ mark the plan finished

Guarantees:

- Only objects in the written plan are ever deleted, and each batch is
  re-checked against tags and leases read just before it, so a GC killed at
  any point has deleted nothing referenced; running it again finishes the job.
- Objects younger than ``grace_s`` are never deleted. This protects a push that
  has written chunks but not yet its manifest and tag, even without a lease.
- A push or a load holds a lease (``snapshotter.leases``) naming what it relies
  on; a lease written after a batch's re-check but before its deletes is the
  one window left, and the push re-checks the chunks it did not upload before
  it tags (``snapshotter.push``), failing with "push again" instead.
- A tag naming an unreadable manifest, image or layer stops GC with an
  ``IntegrityError`` before anything is deleted: what it references is unknown.

Roots are what the store itself holds. Digests held only elsewhere (a control
plane database's older function versions) must be tagged or passed as
``extra_manifests`` to be kept.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from snapshotter import pins
from snapshotter.digest import is_digest
from snapshotter.errors import IntegrityError, NotFoundError
from snapshotter.gc_mark import Live, Roots, classify, mark, plan_sweep
from snapshotter.images import Image, get_image
from snapshotter.layers import LayerToc, get_layer
from snapshotter.leases import active_leases, read_leases
from snapshotter.manifest import Manifest
from snapshotter.registry import Registry
from snapshotter.stores.base import ObjectInfo, Store

DEFAULT_GRACE_S = 3600.0
DEFAULT_BATCH_SIZE = 256
PLAN_PREFIX = "gc/plans/"

Clock = Callable[[], float]
T = TypeVar("T")
ProgressFn = Callable[["SweepProgress"], None]


@dataclass(frozen=True)
class GcPlan:
    id: str
    created_at_s: float
    grace_s: float
    objects: tuple[ObjectInfo, ...]
    live_objects: int

    @property
    def key(self) -> str:
        return f"{PLAN_PREFIX}{self.id}.json"

    @property
    def size_bytes(self) -> int:
        return sum(o.size_bytes for o in self.objects)

    def to_json(self, *, finished: bool = False, deleted: int = 0) -> bytes:
        doc = {
            "schema": "thaw.gc-plan/v1",
            "id": self.id,
            "created_at_s": self.created_at_s,
            "grace_s": self.grace_s,
            "finished": finished,
            "deleted": deleted,
            "objects": [[o.key, o.size_bytes] for o in self.objects],
        }
        return json.dumps(doc, separators=(",", ":")).encode()


@dataclass(frozen=True)
class SweepProgress:
    objects_done: int
    objects_total: int
    bytes_deleted: int


@dataclass(frozen=True)
class SweepResult:
    deleted: int
    bytes_deleted: int
    kept: int  # planned, but found referenced or leased when its batch came


class StoreGraph:
    """The ``Graph`` over a registry: absent → None, present but corrupt → raises."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    def manifest(self, digest: str) -> Manifest | None:
        return self._read(lambda: self.registry.get_manifest(digest), "manifest", digest)

    def image(self, digest: str) -> Image | None:
        return self._read(lambda: get_image(self.registry, digest), "image", digest)

    def layer(self, digest: str) -> LayerToc | None:
        return self._read(lambda: get_layer(self.registry, digest), "layer", digest)

    def _read(self, read: Callable[[], T], kind: str, digest: str) -> T | None:
        try:
            return read()
        except NotFoundError:
            return None
        except IntegrityError as exc:
            raise IntegrityError(
                f"gc stopped before deleting anything it was unsure of: the {kind} {digest} is "
                f"referenced but unreadable ({exc}); delete or re-push what names it, then run "
                "gc again"
            ) from None


def read_roots(registry: Registry, now_s: float, extra_manifests: Iterable[str] = ()) -> Roots:
    """Tags, image tags, pins of deployed functions and unexpired leases, as of now."""
    store = registry.store
    pinned = _tagged(store, pins.PREFIX)  # a pin names a digest, not a kind: keep either
    manifests = _tagged(store, "tags/") | set(extra_manifests) | pinned
    images = _tagged(store, "image-tags/") | pinned
    layers: set[str] = set()
    chunks: set[str] = set()
    for lease in active_leases(read_leases(store), now_s):
        for digest in lease.manifests:
            # A lease names digests, not kinds: whichever kind exists is kept.
            manifests.add(digest)
            images.add(digest)
            layers.add(digest)
        chunks |= lease.chunks
    return Roots(frozenset(manifests), frozenset(images), frozenset(layers), frozenset(chunks))


def _tagged(store: Store, prefix: str) -> set[str]:
    """The digests the tags under ``prefix`` hold. A tag holding something else
    references nothing that could be kept; one deleted since the listing is skipped."""
    out = set()
    for key in store.list(prefix):
        try:
            value = store.get(key).decode(errors="replace").strip()
        except NotFoundError:
            continue
        if is_digest(value):
            out.add(value)
    return out


def plan_gc(
    registry: Registry,
    *,
    grace_s: float = DEFAULT_GRACE_S,
    extra_manifests: Iterable[str] = (),
    clock: Clock = time.time,
) -> tuple[GcPlan, Roots, Live]:
    """Mark and plan; nothing is written or deleted."""
    if grace_s < 0:
        raise ValueError(f"grace_s must be 0 or more, got {grace_s}")
    now_s = clock()
    roots = read_roots(registry, now_s, extra_manifests)
    live = mark(roots, StoreGraph(registry))
    listing = list(_listing(registry))
    doomed = plan_sweep(listing, live, now_s, grace_s)
    named = sum(1 for o in listing if classify(o.key) is not None)
    plan = GcPlan(uuid.uuid4().hex, now_s, grace_s, tuple(doomed), named - len(doomed))
    return plan, roots, live


def _listing(registry: Registry) -> Iterator[ObjectInfo]:
    for prefix in ("chunks/", "manifests/", "images/", "layers/", "profiles/"):
        yield from registry.store.list_info(prefix)


def sweep(
    registry: Registry,
    plan: GcPlan,
    roots: Roots,
    live: Live,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    extra_manifests: Iterable[str] = (),
    progress: ProgressFn | None = None,
    clock: Clock = time.time,
) -> SweepResult:
    """Write the plan, then delete its objects batch by batch (see the module docstring)."""
    store = registry.store
    store.put(plan.key, plan.to_json())
    graph = StoreGraph(registry)
    deleted = bytes_deleted = kept = done = 0
    extra = tuple(extra_manifests)
    for start in range(0, len(plan.objects), max(1, batch_size)):
        batch = plan.objects[start : start + max(1, batch_size)]
        current = read_roots(registry, clock(), extra)
        fresh = current - roots
        if fresh:
            live.update(mark(fresh, graph))
            roots = _union(roots, current)
        for obj in batch:
            named = classify(obj.key)
            if named is None or live.holds(*named):
                kept += 1
                continue
            store.delete(obj.key)
            deleted += 1
            bytes_deleted += obj.size_bytes
        done += len(batch)
        if progress is not None:
            progress(SweepProgress(done, len(plan.objects), bytes_deleted))
    _drop_stale_leases(registry, clock() - plan.grace_s)
    store.put(plan.key, plan.to_json(finished=True, deleted=deleted))
    return SweepResult(deleted, bytes_deleted, kept)


def _drop_stale_leases(registry: Registry, expired_before_s: float) -> None:
    """Leases whose holder died (a killed push) expired long ago: they protect nothing."""
    for lease in read_leases(registry.store):
        if lease.expires_at_s < expired_before_s:
            registry.store.delete(lease.key)


def _union(a: Roots, b: Roots) -> Roots:
    return Roots(
        a.manifests | b.manifests, a.images | b.images, a.layers | b.layers, a.chunks | b.chunks
    )
