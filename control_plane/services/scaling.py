"""Editing a function's scaling, and warming it up ahead of traffic.

Scaling is an operating setting, not code: ``update_scaling`` rewrites the
``scaling`` table of the *active* version in place instead of adding a
version, because a new version would make the reconciler drain every replica
of the old one. (Rolling back to an older version brings back that
version's own scaling.) A change names only what it changes: the fields it
leaves out keep their values, and the merged scaling is what is validated.

``warm`` starts replicas of the active version until N (default 1) are
live, placed by the same pure scheduler as any other start. The
replica then lives ``idle_timeout_s`` from the moment it is ready (the
reconciler counts a replica becoming ready as activity), so a warm-up
bought ahead of a burst is not undone by the next reconcile pass.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from pydantic import ValidationError
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from control_plane.db.models import Function, FunctionVersion, Replica
from control_plane.errors import (
    BadRequestError,
    NoCapacityError,
    NotFoundError,
    UnprocessableError,
)
from control_plane.protocol import StartReplica
from control_plane.services import functions, replicas, workers
from control_plane.services.context import Services
from control_plane.services.functions import ActiveVersion
from control_plane.services.scheduler import ReplicaRequest, place
from control_plane.spec import FunctionSpec, ScalingPatch


@dataclass(frozen=True)
class WarmResult:
    function: str
    started_replica_ids: list[str]
    live_replicas: int
    requested_replicas: int

    @property
    def started_replica_id(self) -> str | None:
        """The first replica this warm-up started (None when enough were live)."""
        return self.started_replica_ids[0] if self.started_replica_ids else None


def update_scaling(session: Session, name: str, change: ScalingPatch) -> functions.FunctionInfo:
    """Apply ``change`` to the active version's scaling; fields it does not set are kept.

    Raises ``NotFoundError``, or ``UnprocessableError`` when the merged scaling is
    invalid (nothing is written then).
    """
    fn = session.scalars(select(Function).where(Function.name == name)).first()
    if fn is None or fn.active_version is None:
        raise NotFoundError(f"no deployed function {name!r}; deploy it first")
    row = session.scalars(
        select(FunctionVersion).where(
            FunctionVersion.function_id == fn.id, FunctionVersion.version == fn.active_version
        )
    ).one()
    spec = FunctionSpec.model_validate_json(row.spec_json)
    try:
        scaling = change.applied_to(spec.scaling)
    except ValidationError as exc:
        reason = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise UnprocessableError(
            f"scaling of {name} would be invalid: {reason} (now {_describe(spec)})"
        ) from None
    row.spec_json = spec.model_copy(update={"scaling": scaling}).model_dump_json()
    session.flush()
    return functions.show(session, name)


def _describe(spec: FunctionSpec) -> str:
    s = spec.scaling
    return (
        f"min_replicas={s.min_replicas}, max_replicas={s.max_replicas}, "
        f"idle_timeout_s={s.idle_timeout_s:g}, target_concurrency={s.target_concurrency}"
    )


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


def warm(services: Services, name: str, replicas_wanted: int = 1) -> WarmResult:
    """Start replicas of ``name`` until ``replicas_wanted`` are live.

    Each start is placed by the scheduler, seeing the ones placed before it.
    Raises ``BadRequestError`` when more than ``max_replicas`` are asked for,
    ``NoCapacityError`` when none could be started; when only some could, the
    result says how many are live.
    """
    with services.reconcile_lock:
        with services.db.session() as session:
            fn = functions.active(session, name)
            _check_wanted(fn.spec.scaling.max_replicas, name, replicas_wanted)
            live = len(replicas.live(session, name))
            starts = _place_starts(services, session, fn, replicas_wanted - live)
        sent = [s.replica_id for w, s in starts if _send(services, w, s)]
    if starts and not sent:
        raise NoCapacityError(
            f"could not send the warm-up of {name} to any worker's queue; "
            "check the broker and try again"
        )
    return WarmResult(name, sent, live + len(sent), replicas_wanted)


def _check_wanted(max_replicas: int, name: str, wanted: int) -> None:
    if wanted < 1 or wanted > max_replicas:
        raise BadRequestError(
            f"cannot warm {wanted} replicas of {name}: between 1 and its max_replicas "
            f"({max_replicas}); raise max_replicas with PATCH /v1/functions/{name}/scaling"
        )


def _place_starts(
    services: Services, session: Session, fn: ActiveVersion, missing: int
) -> list[tuple[str, StartReplica]]:
    """Place and record up to ``missing`` replicas; raises when not even one fits."""
    starts: list[tuple[str, StartReplica]] = []
    request = ReplicaRequest(
        fn.name, fn.spec.device, fn.model_digest, _model_bytes(services, fn.model_digest)
    )
    for _ in range(max(0, missing)):
        now = services.clock()
        t0 = time.perf_counter()
        try:
            placement = place(request, workers.snapshots(session))
        except NoCapacityError:
            if not starts:
                raise
            break
        schedule_ms = (time.perf_counter() - t0) * 1000
        start = replicas.create(session, now, fn, placement, schedule_ms)
        starts.append((placement.worker_id, start))
    return starts


def _send(services: Services, worker_id: str, start: StartReplica) -> bool:
    # Sent only after the commit, like the reconciler: a worker never sees a
    # replica the database does not hold.
    try:
        services.dispatcher.start_replica(worker_id, start)
    except Exception as exc:
        _fail(services, start.replica_id, f"could not reach the worker's queue: {exc}")
        return False
    with services.db.session() as session:
        replicas.mark_dispatched(session, start.replica_id, services.clock())
    return True
