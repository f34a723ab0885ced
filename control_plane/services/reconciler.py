"""Applies the pure decisions to the database, then sends what they imply.

One pass for a function (``reconcile_function``):

1. route queued calls to ready replicas (``router.route``: session,
   prefix, then least outstanding), each moved
   queued → dispatched by a guarded UPDATE, so no call is sent twice;
2. compute the replica target (``autoscaler.decide``, stabilized over the
   history in ``scale_history``) and start
   replicas where ``scheduler.place`` says, or drain idle ones;
3. drain replicas of versions that are no longer active.

``tick`` adds the housekeeping: lost workers, calls past their deadline,
replicas of deleted functions, gauges (every ``GAUGES_EVERY_S``; a scrape
refreshes them too). Messages are collected in an
``Outbox`` and sent only after the transaction commits (a worker must never
see a call the database does not yet show as dispatched); a failed send puts
the call back in the queue.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from control_plane.db.models import Call, Lock, Replica, Worker
from control_plane.dispatch.base import UnsendableError
from control_plane.errors import NoCapacityError, NotFoundError
from control_plane.metrics import Metrics, set_series
from control_plane.protocol import ReplicaEvent, RunCall, StartReplica, StopReplica
from control_plane.services import (
    calls,
    canary,
    direct_calls,
    dispatching,
    functions,
    replicas,
    scale_history,
    steady,
    worker_health,
    workers,
)
from control_plane.services.autoscaler import ScaleState
from control_plane.services.context import Services
from control_plane.services.direct_calls import Claim
from control_plane.services.direct_runner import DirectRunner
from control_plane.services.functions import ActiveVersion
from control_plane.services.llm_metrics import refresh_engine_gauges
from control_plane.services.router import ReplicaView
from control_plane.services.scheduler import Placement, ReplicaRequest, place
from control_plane.services.states import IN_FLIGHT_CALL_STATES, NON_FINAL_CALL_STATES
from control_plane.tracing import call_traceparent

log = logging.getLogger(__name__)

# A scrape of /metrics refreshes the gauges itself; ticks keep them this fresh between.
GAUGES_EVERY_S = 5.0
RECONCILE_LOCK = "reconcile"


@dataclass
class Outbox:
    starts: list[tuple[str, StartReplica]] = field(default_factory=list)
    stops: list[tuple[str, StopReplica]] = field(default_factory=list)
    runs: list[tuple[str, RunCall]] = field(default_factory=list)
    direct_runs: list[Claim] = field(default_factory=list)  # over the worker's direct port
    touched_calls: list[str] = field(default_factory=list)
    # The workers' breakers, read once a pass (every function's routing and scaling
    # asks; nothing in a pass changes them)
    breakers: dict[str, worker_health.BreakerState] | None = None
    # Functions whose pass tried a start or asked for a drain (not steady: ``steady``)
    acted: set[str] = field(default_factory=set)


class Reconciler:
    def __init__(self, services: Services) -> None:
        self.s = services
        # A restarted control plane has heard no heartbeat yet: workers that kept
        # running must not be taken for lost before they had time to send one.
        self._started_at = services.clock()
        self._gauges_at = float("-inf")
        self.direct = DirectRunner(services, self.kick, self.send_run)
        self._steady = steady.SteadyFunctions()

    # --- entry points ---------------------------------------------------------
    def kick(self, function: str) -> None:
        """Reconcile one function now (after an invoke, a ready replica, a result)."""
        with self.s.reconcile_lock:
            box = Outbox()
            with self.s.db.session() as session:
                _serialize_across_processes(session)
                self._steady.forget([function])
                try:
                    versions = canary.serving(session, function)
                except NotFoundError:
                    return
                self._reconcile_versions(session, versions, box)
            self._send(box)

    def send_run(self, worker_id: str, msg: RunCall) -> bool:
        """Send a call already dispatched in the database through the worker's queue;
        False when the broker could not take it. A call that cannot be encoded is
        ended failed instead (it counts as sent: it must not go back to the queue)."""
        try:
            self.s.dispatcher.run_call(worker_id, msg)
        except UnsendableError as exc:
            self.direct.end_unsendable(msg.function, msg, exc)
        except Exception:
            log.exception("could not send %s to worker %s", type(msg).__name__, worker_id)
            return False
        return True

    def tick(self) -> None:
        """One full pass over every function plus housekeeping."""
        with self.s.reconcile_lock:
            box = Outbox()
            now = self.s.clock()
            with self.s.db.session() as session:
                _serialize_across_processes(session)
                if now - self._started_at >= self.s.worker_lost_after_s:
                    lost_after_s = self.s.worker_lost_after_s
                    lost = workers.mark_lost(session, self.s.metrics, now, lost_after_s)
                    box.touched_calls += lost.touched_call_ids
                box.touched_calls += self._expire(session, now)
                box.touched_calls += self._give_up_slow_starts(session, now, box)
                live_names = set(functions.names(session))
                pulses = steady.read(session, self._breakers(session, now, box))
                for name in sorted(live_names):
                    pulse = pulses.get(name)
                    if pulse is not None and self._steady.skip(name, pulse):
                        continue
                    self._reconcile_versions(session, canary.serving(session, name), box)
                    if pulse is not None:
                        self._steady.passed(name, pulse, acted=name in box.acted)
                self._drain_orphans(session, live_names, box)
                if now - self._gauges_at >= GAUGES_EVERY_S:
                    self._gauges(session)
                    self._gauges_at = now
            self._send(box)

    # --- one function ---------------------------------------------------------
    def _reconcile_versions(
        self, session: Session, versions: list[ActiveVersion], box: Outbox
    ) -> None:
        """Route and scale each serving version (the active one, then a canary) on its
        own calls, with replicas of its own; run the calls still queued on a version
        that no longer serves on that version (``canary.finishing``); drain replicas
        of any other version."""
        now = self.s.clock()
        for fn in versions:
            self._route_queued(session, fn, now, box)
            self._scale(session, fn, now, box)
        finishing = canary.finishing(session, versions)
        for fn in finishing:
            self._route_queued(session, fn, now, box)
            self._finish(session, fn, now, box)
        kept = {fn.version for fn in [*versions, *finishing]}
        for r in replicas.live(session, versions[0].name):
            if r.version not in kept:
                self._drain_if_idle(session, r, "a newer version is active", box)

    def _finish(self, session: Session, fn: ActiveVersion, now: float, box: Outbox) -> None:
        """A version that takes no new calls but still holds queued ones: one replica
        of it, started if none is live, serves them; it drains once they are done."""
        open_workers = set(self._breakers(session, now, box))
        mine = [
            r
            for r in replicas.live(session, fn.name)
            if r.version == fn.version and r.worker_id not in open_workers
        ]
        if not mine and _count(session, fn.name, ("queued",), fn.version):
            self._start(session, fn, now, box)

    def _route_queued(self, session: Session, fn: ActiveVersion, now: float, box: Outbox) -> None:
        queued = session.scalars(
            select(Call)
            .where(Call.function == fn.name, Call.version == fn.version, Call.status == "queued")
            .order_by(Call.accepted_at)
        ).all()
        if not queued:
            return
        breakers = self._breakers(session, now, box)
        places: dict[str, replicas.ReplicaHome] = {}
        live = replicas.views(session, fn.name, places)
        worker_of = {rid: place.worker_id for rid, place in places.items()}
        views = {v.id: v for v in live if breakers.get(worker_of[v.id], "closed") != "open"}
        for call in queued:
            # A half-open worker's probe goes first; if it cannot take it, any replica.
            first = _probe_first(views, worker_of, breakers)
            done = dispatching.route_one(session, self.s.metrics, fn, call, first, places, now)
            if done == dispatching.NO_ROOM:
                rest = list(views.values())
                done = dispatching.route_one(session, self.s.metrics, fn, call, rest, places, now)
            if done == dispatching.NO_ROOM:
                return
            if not isinstance(done, dispatching.Dispatched):
                continue  # no longer queued: someone else dispatched it
            views[done.view.id] = replace(done.view, outstanding=done.view.outstanding + 1)
            probed = done.place.worker_id
            if breakers.get(probed) == "half_open":  # one probe call, then wait for it
                views = {k: v for k, v in views.items() if worker_of.get(k) != probed}
                box.breakers = None  # it has a call in flight now: read again
            if self.direct.enabled and not call.stream:
                box.direct_runs.append(direct_calls.claim_of(fn.name, call, done))
            else:
                box.runs.append((probed, done.message))
            box.touched_calls.append(call.id)

    def _scale(self, session: Session, fn: ActiveVersion, now: float, box: Outbox) -> None:
        scaling = fn.spec.scaling
        # Replicas on a worker whose breaker is open serve nothing: they do not count.
        open_workers = set(self._breakers(session, now, box))  # open or half-open (probing)
        mine = [
            r
            for r in replicas.live(session, fn.name)
            if r.version == fn.version and r.worker_id not in open_workers
        ]
        state = ScaleState(
            min_replicas=scaling.min_replicas,
            max_replicas=scaling.max_replicas,
            idle_timeout_s=scaling.idle_timeout_s,
            target_concurrency=fn.spec.replica_capacity,
            in_flight=_count(session, fn.name, IN_FLIGHT_CALL_STATES, fn.version),
            queued=_count(session, fn.name, ("queued",), fn.version),
            current_replicas=len(mine),
            last_call_at=_last_call_at(session, fn.name),
        )
        # A canary scales on its own calls alone, with its own history.
        windows = scale_history.windows(self.s.settings)
        target = scale_history.target(session, fn.name, fn.version, state, windows, now)
        for _ in range(target - len(mine)):
            if not self._start(session, fn, now, box):
                break
        idle_ready = [r for r in reversed(mine) if r.state == "ready"]
        for r in idle_ready[: max(0, len(mine) - target)]:
            self._drain_if_idle(session, r, "scaled down", box)

    def _start(self, session: Session, fn: ActiveVersion, now: float, box: Outbox) -> bool:
        t0 = time.perf_counter()
        box.acted.add(fn.name)
        request = ReplicaRequest(fn.name, fn.spec.device, fn.model_digest, _model_bytes(self.s, fn))
        try:
            placement = self._place(session, fn.name, request, now, box)
        except NoCapacityError as exc:
            # Every tick retries; say it once per function until the reason changes.
            if self.s.placement_errors.get(fn.name) != str(exc):
                self.s.placement_errors[fn.name] = str(exc)
                log.warning("cannot start a replica of %s yet: %s", fn.name, exc)
            return False
        self.s.placement_errors.pop(fn.name, None)
        schedule_ms = (time.perf_counter() - t0) * 1000
        log.debug(
            "placing %s on %s: estimated start %.2f s, bytes from %s",
            fn.name,
            placement.worker_id,
            placement.estimated_start_s,
            placement.source_tier,
        )
        requested_at = _oldest_queued_at(session, fn.name)
        start = replicas.create(session, now, fn, placement, schedule_ms, requested_at)
        start.traceparent = _start_traceparent(session, fn.name)
        box.starts.append((placement.worker_id, start))
        return True

    def _place(
        self, session: Session, function: str, request: ReplicaRequest, now: float, box: Outbox
    ) -> Placement:
        """On a worker whose breaker is closed; failing that, as a probe, on a half-open
        one that runs no replica of ``function`` yet (a breaker's way back that does
        not need a replica to exist). Raises ``NoCapacityError``."""
        snapshots = workers.snapshots(session)
        breakers = self._breakers(session, now, box)
        try:
            return place(request, worker_health.without_open(snapshots, breakers))
        except NoCapacityError:
            holding = {r.worker_id for r in replicas.live(session, function)}
            probe = {w: b for w, b in breakers.items() if b == "open" or w in holding}
            if len(probe) == len(breakers):
                raise
            return place(request, worker_health.without_open(snapshots, probe, probing=True))

    def _breakers(
        self, session: Session, now: float, box: Outbox
    ) -> dict[str, worker_health.BreakerState]:
        if box.breakers is None:
            s = self.s.settings
            threshold, interval_s = s.worker_failure_threshold, s.worker_probe_interval_s
            box.breakers = worker_health.states(session, now, threshold, interval_s)
        return box.breakers

    def _drain_if_idle(self, session: Session, r: Replica, reason: str, box: Outbox) -> None:
        box.acted.add(r.function)
        if replicas.outstanding(session, [r.id]).get(r.id, 0):
            return
        r.state = "draining"
        box.stops.append((r.worker_id, StopReplica(replica_id=r.id, reason=reason)))

    # --- housekeeping ---------------------------------------------------------
    def _expire(self, session: Session, now: float) -> list[str]:
        late = session.scalars(
            select(Call.id).where(Call.status.in_(NON_FINAL_CALL_STATES), Call.deadline_at <= now)
        ).all()
        for call_id in late:
            calls.end_at_deadline(session, self.s.metrics, now, call_id)
        return list(late)

    def _give_up_slow_starts(self, session: Session, now: float, box: Outbox) -> list[str]:
        """Replicas not ready within ``replica_start_timeout_s`` count as failed starts
        (a lost start message or a hung setup must not hold calls forever)."""
        limit_s = self.s.settings.replica_start_timeout_s
        slow = session.scalars(
            select(Replica).where(
                Replica.state.in_(("pending", "starting")), Replica.created_at < now - limit_s
            )
        ).all()
        touched: list[str] = []
        for r in slow:
            error = _slow_start_error(session, r, limit_s)
            # Most often a setup that hangs, which the next start would repeat: the
            # function's fault (its waiting calls end with this error, and the worker's
            # breaker does not count it).
            ev = ReplicaEvent(state="failed", error=error, fault="function")
            touched += replicas.record_event(session, self.s.metrics, now, r.id, ev)
            box.stops.append((r.worker_id, StopReplica(replica_id=r.id, reason=error)))
        return touched

    def _drain_orphans(self, session: Session, live_names: set[str], box: Outbox) -> None:
        rows = session.scalars(
            select(Replica).where(Replica.state.in_(("pending", "starting", "ready")))
        ).all()
        for r in rows:
            if r.function not in live_names:
                self._drain_if_idle(session, r, "function deleted", box)

    def _gauges(self, session: Session) -> None:
        refresh_gauges(session, self.s.metrics)

    # --- after commit ---------------------------------------------------------
    def _send(self, box: Outbox) -> None:
        d = self.s.dispatcher
        for worker_id, start in box.starts:
            if _try(d.start_replica, worker_id, start):
                self._mark_sent(start.replica_id)
            else:
                self._fail_replica(start.replica_id)
        for worker_id, stop in box.stops:
            _try(d.stop_replica, worker_id, stop)
        # A routed call goes over the worker's direct port when it can, else its queue.
        not_direct = [(c.worker_id, c.message) for c in box.direct_runs if not self.direct.start(c)]
        for worker_id, run in box.runs + not_direct:
            if not self.send_run(worker_id, run):
                self._requeue(run.call_id)
        for call_id in box.touched_calls:
            self.s.notifier.notify(call_id)

    def _mark_sent(self, replica_id: str) -> None:
        with self.s.db.session() as session:
            replicas.mark_dispatched(session, replica_id, self.s.clock())

    def _fail_replica(self, replica_id: str) -> None:
        with self.s.db.session() as session:
            session.execute(
                update(Replica)
                .where(Replica.id == replica_id, Replica.state == "pending")
                .values(state="failed", error="could not reach the worker's queue")
            )

    def _requeue(self, call_id: str) -> None:
        with self.s.db.session() as session:
            dispatching.requeue(session, call_id)


def _serialize_across_processes(session: Session) -> None:
    """Take the ``reconcile`` row lock for this pass (held until commit).

    Several control-plane processes may reconcile at once; the lock makes
    their read-decide-write passes take turns, so two do not both start a
    replica for the same queued call. It must be the pass's first statement.
    """
    session.execute(update(Lock).where(Lock.name == RECONCILE_LOCK).values(name=Lock.name))


def refresh_gauges(session: Session, m: Metrics) -> None:
    """Set the replica, queue-depth and pool gauges from the database (ticks and scrapes)."""
    workers.refresh_pool_gauges(session, m)
    refresh_engine_gauges(session, m.llm)
    by_state = replicas.counts_by_state(session)
    set_series(m.replicas, {(fn, state): n for (fn, state), n in by_state.items()})
    rows = session.execute(
        select(Call.function, func.count(Call.id))
        .where(Call.status == "queued")
        .group_by(Call.function)
    ).all()
    set_series(m.queue_depth, {(fn,): n for fn, n in rows})


def _try(send: Callable[[str, Any], None], worker_id: str, msg: Any) -> bool:
    """Send one message; a broker failure is logged and reported, not raised."""
    try:
        send(worker_id, msg)
        return True
    except Exception:
        log.exception("could not send %s to worker %s", type(msg).__name__, worker_id)
        return False


def _probe_first(
    views: dict[str, ReplicaView],
    worker_of: dict[str, str],
    breakers: dict[str, worker_health.BreakerState],
) -> list[ReplicaView]:
    """The replicas of half-open workers if there are any (their probe call goes
    first: a least-loaded choice would never pick them), else all of them."""
    probing = [v for v in views.values() if breakers.get(worker_of.get(v.id, "")) == "half_open"]
    return probing or list(views.values())


def _count(session: Session, function: str, states: tuple[str, ...], version: int) -> int:
    n = session.scalar(
        select(func.count(Call.id)).where(
            Call.function == function, Call.version == version, Call.status.in_(states)
        )
    )
    return int(n or 0)


def _start_traceparent(session: Session, function: str) -> str | None:
    """The trace of the longest-waiting queued call: a start is for it (tracing)."""
    call_id = session.scalar(
        select(Call.id)
        .where(Call.function == function, Call.status == "queued")
        .order_by(Call.accepted_at)
        .limit(1)
    )
    return call_traceparent(call_id) if call_id is not None else None


def _oldest_queued_at(session: Session, function: str) -> float | None:
    """When the longest-waiting queued call was accepted: the start of its schedule phase."""
    oldest = session.scalar(
        select(func.min(Call.accepted_at)).where(Call.function == function, Call.status == "queued")
    )
    return float(oldest) if oldest is not None else None


def _last_call_at(session: Session, function: str) -> float | None:
    # Two queries, not one with two maxima: each reads one end of its index.
    accepted = session.scalar(select(func.max(Call.accepted_at)).where(Call.function == function))
    finished = session.scalar(select(func.max(Call.finished_at)).where(Call.function == function))
    # A replica becoming ready counts as activity too, so a warm-up
    # (services.scaling.warm) lives idle_timeout_s before it is scaled away.
    ready = session.scalar(select(func.max(Replica.ready_at)).where(Replica.function == function))
    times = [t for t in (accepted, finished, ready) if t is not None]
    return max(times) if times else None


def _model_bytes(services: Services, fn: ActiveVersion) -> int:
    # Memory is checked only when workers report it; the size comes from the manifest.
    if fn.model_digest is None:
        return 0
    try:
        return services.registry.get_manifest(fn.model_digest).raw_size
    except Exception:
        return 0


def _slow_start_error(session: Session, r: Replica, limit_s: float) -> str:
    """Why ``r`` is given up, as far as the books tell: a start message no worker
    took (``pending``) points at the worker's broker; ``starting``, at the setup."""
    error = f"the replica did not become ready within {limit_s:g} s"
    worker = session.get(Worker, r.worker_id)
    name = (worker.name or worker.id) if worker is not None else r.worker_id
    if r.state == "pending":
        return (
            f"{error}: worker {name} never took its start message (is its broker the "
            "control plane's? compare its THAW_BROKER_URL with the server's)"
        )
    return f"{error}: it was still starting on worker {name} (its setup may hang)"
