"""The invoke and worker-event use cases: one transaction, then wake and reconcile.

Routers call these; each opens its own session, commits, and only then
notifies waiters and asks the reconciler to act, so nobody is woken to read
state that is not yet committed. A synchronous call may take the fast path
(``services.direct_calls``): routed in the transaction that accepts it and
run over the worker's direct port by the caller's own thread.
"""

from __future__ import annotations

import contextlib
import logging
import threading

from control_plane.dispatch.direct import DirectLostError, DirectUnavailableError
from control_plane.errors import ConflictError
from control_plane.protocol import (
    CallEvent,
    HeartbeatReply,
    ReplicaEvent,
    WorkerHeartbeat,
    WorkerRegister,
    WorkerRegistered,
)
from control_plane.services import (
    batching,
    calls,
    canary,
    direct_calls,
    dispatching,
    replicas,
    worker_health,
    workers,
)
from control_plane.services.activator import Activator
from control_plane.services.call_spans import call_spans, invoke_span
from control_plane.services.calls import CallRequest, CallView
from control_plane.services.context import Services
from control_plane.services.direct_calls import Claim
from control_plane.services.keys import Principal
from control_plane.services.reconciler import Reconciler

log = logging.getLogger(__name__)


class Invocations:
    def __init__(self, services: Services, reconciler: Reconciler) -> None:
        self.s = services
        self.reconciler = reconciler
        self.activator = Activator(services)
        # Fast-path routing decisions take turns in this process, so two callers
        # do not both count the same free slot of a replica.
        self._claim_lock = threading.Lock()
        self._breakers = worker_health.BreakerCache()
        s = services.settings
        self._breaker_settings = (s.worker_failure_threshold, s.worker_probe_interval_s)

    # --- clients --------------------------------------------------------------
    def invoke(
        self, who: Principal, function: str, req: CallRequest, *, direct: bool = False
    ) -> tuple[CallView, bool]:
        """Accept a call (or find it by idempotency key) and start routing it.

        ``direct``: the caller will wait for the end; a new call that finds a
        ready replica with room is run here, over the worker's direct port,
        and this returns once it ended (or was handed back to the queue).
        """
        who.require("invoke", function)  # before the lookup: no existence leak
        fast = direct and self.s.direct is not None
        claim: Claim | None = None
        with self._claim_lock if fast else contextlib.nullcontext(), self.s.db.session() as session:
            fn = canary.for_call(session, function)  # the active version or its canary
            now = self.s.clock()
            view, created = calls.accept(session, now, who, fn, req, self.s.registry)
            if fast and created:
                breakers = self._breakers.get(session, now, *self._breaker_settings)
                claim = direct_calls.claim(session, self.s.metrics, fn, view.id, now, breakers)
        if claim is not None:
            self._run_claim(claim)
        elif created:
            self.reconciler.kick(function)
        return view, created

    def _run_claim(self, claim: Claim) -> None:
        """Send a fast-path call and record its final event; on failure, leave it
        to the queue (not sent) or to the database (sent, see ``direct_calls``)."""
        if claim.data_addr is None or claim.data_token is None or self.s.direct is None:
            if not self.reconciler.send_run(claim.worker_id, claim.message):
                self._requeue(claim)
            return
        timeout_s = claim.deadline_at - self.s.clock()
        outcome = "ran"
        try:
            events = self.s.direct.run(claim.data_addr, claim.data_token, claim.message, timeout_s)
            for ev in events:
                if ev.kind != "started":  # dispatched and running count alike as in flight
                    self._record(claim, ev)
        except DirectUnavailableError as exc:
            log.warning("direct port unavailable, queueing call %s: %s", claim.call_id, exc)
            outcome = "unavailable"
            self._requeue(claim)
        except DirectLostError as exc:
            log.info("%s; waiting for the worker's report", exc)
            outcome = "lost"
        self.s.metrics.direct_calls.labels(claim.function, outcome).inc()

    def _record(self, claim: Claim, ev: CallEvent) -> None:
        with self._claim_lock, self.s.db.session() as session:
            try:
                calls.record_event(session, self.s.metrics, self.s.clock(), claim.call_id, ev)
            except ConflictError:
                return  # ended meanwhile (cancelled, deadline): the first end stands
            batching.observe(session, self.s.metrics, claim.function, ev)
            kick = ev.kind not in ("started", "output") and direct_calls.has_queued(
                session, claim.function
            )
        self.s.notifier.notify(claim.call_id)
        if kick:
            self.reconciler.kick(claim.function)
        if ev.kind not in ("started", "output"):
            self._trace_final(claim.call_id)

    def _requeue(self, claim: Claim) -> None:
        with self.s.db.session() as session:
            dispatching.requeue(session, claim.call_id)
        self.reconciler.kick(claim.function)

    def get(self, who: Principal, call_id: str) -> CallView:
        with self.s.db.session() as session:
            view = calls.get(session, call_id)
        who.require("invoke", view.function)
        return view

    def cancel(self, who: Principal, call_id: str) -> CallView:
        self.get(who, call_id)
        with self.s.db.session() as session:
            view = calls.cancel(session, self.s.metrics, self.s.clock(), call_id)
        self.s.notifier.notify(call_id)
        self.reconciler.kick(view.function)
        self.s.tracing.emit(call_spans(view))
        return view

    def trace_invoke(
        self, call_id: str, function: str, start_s: float, http_status: int, mode: str
    ) -> None:
        """Emit the request's root span (``thaw.invoke``), when tracing is on."""
        if self.s.tracing.enabled:
            span = invoke_span(call_id, function, start_s, self.s.clock(), http_status, mode)
            self.s.tracing.emit([span])

    def _trace_final(self, call_id: str) -> None:
        if not self.s.tracing.enabled:
            return
        with self.s.db.session() as session:
            view = calls.get(session, call_id)
        self.s.tracing.emit(call_spans(view))

    # --- workers --------------------------------------------------------------
    def register(self, msg: WorkerRegister) -> WorkerRegistered:
        with self.s.db.session() as session:
            row, touched = workers.register(session, self.s.metrics, self.s.clock(), msg)
            queue = row.queue
        for call_id in touched:
            self.s.notifier.notify(call_id)
        return WorkerRegistered(
            worker_id=msg.worker_id,
            queue=queue,
            heartbeat_interval_s=self.s.settings.heartbeat_interval_s,
        )

    def heartbeat(self, worker_id: str, msg: WorkerHeartbeat) -> HeartbeatReply:
        with self.s.db.session() as session:
            return workers.heartbeat(session, self.s.clock(), worker_id, msg)

    def replica_event(self, replica_id: str, ev: ReplicaEvent) -> None:
        with self.s.db.session() as session:
            touched = replicas.record_event(session, self.s.metrics, self.s.clock(), replica_id, ev)
            function = replicas.function_of(session, replica_id)
        for call_id in touched:
            self.s.notifier.notify(call_id)
        self.reconciler.kick(function)

    def call_event(self, call_id: str, ev: CallEvent) -> None:
        with self.s.db.session() as session:
            calls.record_event(session, self.s.metrics, self.s.clock(), call_id, ev)
            function = calls.get(session, call_id).function
            batching.observe(session, self.s.metrics, function, ev)
        self.s.notifier.notify(call_id)
        if ev.kind not in ("started", "output"):
            self.reconciler.kick(function)
            self._trace_final(call_id)
