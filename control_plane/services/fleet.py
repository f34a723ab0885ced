"""The workers as an operator sees them: devices, memory, pool, cache, replicas.

The cache tiers a worker reports: its disk chunk cache (the bytes it holds
and which manifests are complete in it, protocol v1) and, when the worker
sends ``holdings``, what its host RAM tier and its devices hold. Each manifest digest is
named with the store's tags that point at it, so the console can say "llama:v1"
instead of a digest; a digest no tag points at is shown as is.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from control_plane.db.models import Replica, Worker
from control_plane.services import inventory
from control_plane.services.states import LIVE_REPLICA_STATES


@dataclass(frozen=True)
class ReplicaInfo:
    id: str
    function: str
    version: int
    state: str
    device: str


@dataclass(frozen=True)
class CachedArtifact:
    digest: str
    refs: list[str]


@dataclass(frozen=True)
class CacheTier:
    tier: str
    bytes: int
    artifacts: list[CachedArtifact]


@dataclass(frozen=True)
class WorkerInfo:
    id: str
    name: str
    devices: list[dict[str, Any]]
    memory_bytes: int
    free_memory_bytes: int
    pool_size: int
    cache: list[CacheTier]
    replicas: list[ReplicaInfo]
    healthy: bool
    lost: bool
    last_heartbeat_at: float


def _replicas_by_worker(session: Session) -> dict[str, list[ReplicaInfo]]:
    out: dict[str, list[ReplicaInfo]] = {}
    rows = session.scalars(
        select(Replica)
        .where(Replica.state.in_((*LIVE_REPLICA_STATES, "draining")))
        .order_by(Replica.created_at)
    )
    for r in rows:
        info = ReplicaInfo(r.id, r.function, r.version, r.state, r.device)
        out.setdefault(r.worker_id, []).append(info)
    return out


def _tiers(
    w: Worker, disk: list[CachedArtifact], refs_by_digest: Mapping[str, list[str]]
) -> list[CacheTier]:
    """Disk first (v1), then the faster tiers a worker reports holdings for."""
    holdings = inventory.decode(w.inventory_json).holdings
    tiers = [CacheTier("disk", w.cache_bytes, disk)]
    for tier in ("ram", "device"):
        held = [h for h in holdings if h.tier == tier]
        if held:
            arts = [
                CachedArtifact(h.digest, sorted(refs_by_digest.get(h.digest, []))) for h in held
            ]
            tiers.append(CacheTier(tier, sum(h.bytes for h in held), arts))
    return tiers


def list_workers(session: Session, refs_by_digest: Mapping[str, list[str]]) -> list[WorkerInfo]:
    """Every worker, lost ones last; ``refs_by_digest`` names cached manifests."""
    replicas = _replicas_by_worker(session)
    out = []
    for w in session.scalars(select(Worker).order_by(Worker.lost, Worker.name, Worker.id)):
        cached = [
            CachedArtifact(d, sorted(refs_by_digest.get(d, [])))
            for d in json.loads(w.cached_manifests_json)
        ]
        out.append(
            WorkerInfo(
                id=w.id,
                name=w.name,
                devices=json.loads(w.devices_json),
                memory_bytes=w.memory_bytes,
                free_memory_bytes=w.free_memory_bytes,
                pool_size=w.pool_size,
                cache=_tiers(w, cached, refs_by_digest),
                replicas=replicas.get(w.id, []),
                healthy=w.healthy,
                lost=w.lost,
                last_heartbeat_at=w.last_heartbeat_at,
            )
        )
    return out
