"""Editing a function's scaling, and warming it up ahead of traffic.

Scaling is an operating setting, not code: ``update_scaling`` rewrites the
``scaling`` table of the *active* version in place instead of adding a
version, because a new version would make the reconciler drain every replica
of the old one. (Rolling back to an older version brings back that
version's own scaling.)

``warm`` starts one replica of the active version when the function has
none live, placed by the same pure scheduler as any other start. The
replica then lives ``idle_timeout_s`` from the moment it is ready (the
reconciler counts a replica becoming ready as activity), so a warm-up
bought ahead of a burst is not undone by the next reconcile pass.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from control_plane.db.models import Function, FunctionVersion, Replica
from control_plane.errors import NoCapacityError, NotFoundError
from control_plane.services import functions, replicas, workers
from control_plane.services.context import Services
from control_plane.services.scheduler import ReplicaRequest, place
from control_plane.spec import FunctionSpec, Scaling


@dataclass(frozen=True)
class WarmResult:
    function: str
    started_replica_id: str | None
    live_replicas: int


def update_scaling(session: Session, name: str, scaling: Scaling) -> functions.FunctionInfo:
    """Replace the active version's scaling. Raises ``NotFoundError``."""
    fn = session.scalars(select(Function).where(Function.name == name)).first()
    if fn is None or fn.active_version is None:
        raise NotFoundError(f"no deployed function {name!r}; deploy it first")
    row = session.scalars(
        select(FunctionVersion).where(
            FunctionVersion.function_id == fn.id, FunctionVersion.version == fn.active_version
        )
    ).one()
    spec = FunctionSpec.model_validate_json(row.spec_json)
    row.spec_json = spec.model_copy(update={"scaling": scaling}).model_dump_json()
    session.flush()
    return functions.show(session, name)


def _model_bytes(services: Services, model_digest: str | None) -> int:
    if model_digest is None:
        return 0
    return services.registry.get_manifest(model_digest).raw_size


def _fail(services: Services, replica_id: str, error: str) -> None:
    with services.db.session() as session:
        session.execute(
            update(Replica)
            .where(Replica.id == replica_id, Replica.state == "pending")
            .values(state="failed", error=error)
        )


def warm(services: Services, name: str) -> WarmResult:
    """Start a replica of ``name`` unless one is live. Raises ``NoCapacityError``."""
    with services.reconcile_lock:
        with services.db.session() as session:
            fn = functions.active(session, name)
            live = replicas.live(session, name)
            if live:
                return WarmResult(name, None, len(live))
            t0 = time.perf_counter()
            request = ReplicaRequest(
                name, fn.spec.device, fn.model_digest, _model_bytes(services, fn.model_digest)
            )
            placement = place(request, workers.snapshots(session))
            schedule_ms = (time.perf_counter() - t0) * 1000
            start = replicas.create(session, services.clock(), fn, placement, schedule_ms)
        # Sent only after the commit, like the reconciler: a worker never sees a
        # replica the database does not hold.
        try:
            services.dispatcher.start_replica(placement.worker_id, start)
        except Exception as exc:
            _fail(services, start.replica_id, f"could not reach the worker's queue: {exc}")
            raise NoCapacityError(
                f"could not send the warm-up to worker {placement.worker_id} ({exc}); "
                "check the broker and try again"
            ) from exc
    return WarmResult(name, start.replica_id, 1)
