"""Leases: what a push or a load in progress protects from garbage collection.

A lease is a small JSON object in the store at ``leases/<id>.json``::

    {"schema": "thaw.lease/v1", "id": "…", "holder": "push llama:v1",
     "expires_at_s": 1700000060.0,                 # wall clock, seconds since the epoch
     "manifests": ["blake3:…"],                    # live with everything they reference
     "chunks": ["blake3:…"]}                       # live themselves

``LeaseKeeper`` writes it on entry, rewrites it with a later expiry every
``ttl_s / 4`` seconds from a daemon thread, and deletes it on exit. ``protect``
adds digests and rewrites the lease before it returns, so a digest is in the
store's copy of the lease before its holder relies on the object existing;
``add`` only notes them, and the thread writes them within
``flush_interval_s`` (one write for many digests, for a push's hot path).
A holder that dies stops refreshing: its lease expires after ``ttl_s`` and GC
(``snapshotter.gc``) then ignores it.

Leases compare wall clocks across machines; keep ``ttl_s`` well above any
clock skew (the default is minutes).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import TracebackType

from snapshotter.digest import is_digest
from snapshotter.errors import IntegrityError, NotFoundError, StoreError
from snapshotter.json_doc import parse_json_object
from snapshotter.stores.base import Store

LEASE_SCHEMA = "thaw.lease/v1"
LEASE_PREFIX = "leases/"
DEFAULT_LEASE_TTL_S = 120.0
DEFAULT_FLUSH_INTERVAL_S = 0.5

log = logging.getLogger(__name__)
Clock = Callable[[], float]


@dataclass(frozen=True)
class Lease:
    id: str
    holder: str
    expires_at_s: float
    manifests: frozenset[str] = frozenset()
    chunks: frozenset[str] = frozenset()

    @property
    def key(self) -> str:
        return f"{LEASE_PREFIX}{self.id}.json"

    def to_json(self) -> bytes:
        doc = {
            "schema": LEASE_SCHEMA,
            "id": self.id,
            "holder": self.holder,
            "expires_at_s": self.expires_at_s,
            "manifests": sorted(self.manifests),
            "chunks": sorted(self.chunks),
        }
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Lease:
        try:
            doc = parse_json_object(data, "lease", error=IntegrityError)
            if doc.get("schema") != LEASE_SCHEMA:
                raise IntegrityError(f"unsupported lease schema {doc.get('schema')!r}")
            lease = cls(
                id=str(doc["id"]),
                holder=str(doc["holder"]),
                expires_at_s=float(doc["expires_at_s"]),
                manifests=frozenset(str(d) for d in doc["manifests"]),
                chunks=frozenset(str(d) for d in doc["chunks"]),
            )
        except IntegrityError:
            raise
        except (ValueError, KeyError, TypeError) as exc:
            raise IntegrityError(f"lease is malformed: {exc!r}") from None
        if not all(is_digest(d) for d in lease.manifests | lease.chunks):
            raise IntegrityError(f"lease {lease.id} names something that is not a digest")
        return lease


def read_leases(store: Store) -> list[Lease]:
    """Every lease in the store, expired or not.

    Raises ``IntegrityError`` for a lease that cannot be read: GC must not
    guess what it protects.
    """
    leases = []
    for key in store.list(LEASE_PREFIX):
        if not key.endswith(".json"):
            continue
        try:
            data = store.get(key)
        except NotFoundError:
            continue  # released since it was listed
        try:
            leases.append(Lease.from_json(data))
        except IntegrityError as exc:
            raise IntegrityError(
                f"{key} in store {store.url}: {exc}; delete it if no push or load is running"
            ) from None
    return leases


def confirm_stored(
    lease: LeaseKeeper, digests: set[str], has_chunk: Callable[[str], bool], url: str
) -> None:
    """After ``lease`` names ``digests`` in the store, check each chunk is still there.

    A push calls this before it tags, for the chunks it found already stored
    (and so did not upload): a ``thaw gc`` that planned them as garbage before
    the push began may have deleted them since. Raises ``StoreError`` then.
    """
    lease.protect(chunks=digests)
    for digest in sorted(digests):
        if not has_chunk(digest):
            raise StoreError(
                f"chunk {digest} was deleted from {url} while this push ran (a concurrent "
                "`thaw gc`); push again: chunks already stored are skipped"
            )


def active_leases(leases: Iterable[Lease], now_s: float) -> list[Lease]:
    """The leases not yet expired at ``now_s`` (pure)."""
    return [lease for lease in leases if lease.expires_at_s > now_s]


class LeaseKeeper:
    """Holds one lease while a ``with`` block runs; see the module docstring."""

    def __init__(
        self,
        store: Store,
        holder: str,
        *,
        ttl_s: float = DEFAULT_LEASE_TTL_S,
        manifests: Iterable[str] = (),
        flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S,
        clock: Clock = time.time,
    ) -> None:
        if ttl_s <= 0:
            raise ValueError(f"a lease needs a positive ttl_s, got {ttl_s}")
        self.store = store
        self.ttl_s = ttl_s
        self._tick_s = min(ttl_s / 4, flush_interval_s)
        self._written_at_s = 0.0
        self._clock = clock
        self._id = uuid.uuid4().hex
        self._holder = holder
        self._manifests = set(manifests)
        self._chunks: set[str] = set()
        self._written = 0  # digests count at the last write
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def key(self) -> str:
        return f"{LEASE_PREFIX}{self._id}.json"

    def __enter__(self) -> LeaseKeeper:
        self._write()
        self._thread = threading.Thread(target=self._refresh, name="thaw-lease", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            self.store.delete(self.key)
        except StoreError as err:
            log.warning("could not release lease %s (it expires by itself): %s", self.key, err)

    def protect(self, *, manifests: Iterable[str] = (), chunks: Iterable[str] = ()) -> None:
        """Add digests; the lease in the store names them when this returns."""
        with self._lock:
            self._manifests.update(manifests)
            self._chunks.update(chunks)
            if len(self._manifests) + len(self._chunks) == self._written:
                return
            self._write_locked()

    def add(self, *, manifests: Iterable[str] = (), chunks: Iterable[str] = ()) -> None:
        """Add digests; the lease in the store names them within ``flush_interval_s``."""
        with self._lock:
            self._manifests.update(manifests)
            self._chunks.update(chunks)

    def _write(self) -> None:
        with self._lock:
            self._write_locked()

    def _write_locked(self) -> None:
        lease = Lease(
            self._id,
            self._holder,
            self._clock() + self.ttl_s,
            frozenset(self._manifests),
            frozenset(self._chunks),
        )
        self.store.put(lease.key, lease.to_json())
        self._written = len(lease.manifests) + len(lease.chunks)
        self._written_at_s = self._clock()

    def _refresh(self) -> None:
        while not self._stop.wait(self._tick_s):
            with self._lock:
                dirty = len(self._manifests) + len(self._chunks) != self._written
                due = self._clock() - self._written_at_s >= self.ttl_s / 4
                if not (dirty or due):
                    continue
                try:
                    self._write_locked()
                except StoreError as err:
                    log.warning("could not refresh lease %s: %s", self.key, err)
