"""The invoke and worker-event use cases: one transaction, then wake and reconcile.

Routers call these; each opens its own session, commits, and only then
notifies waiters and asks the reconciler to act, so nobody is woken to read
state that is not yet committed.
"""

from __future__ import annotations

from control_plane.protocol import (
    CallEvent,
    HeartbeatReply,
    ReplicaEvent,
    WorkerHeartbeat,
    WorkerRegister,
    WorkerRegistered,
)
from control_plane.services import calls, functions, replicas, workers
from control_plane.services.activator import Activator
from control_plane.services.calls import CallRequest, CallView
from control_plane.services.context import Services
from control_plane.services.keys import Principal
from control_plane.services.reconciler import Reconciler


class Invocations:
    def __init__(self, services: Services, reconciler: Reconciler) -> None:
        self.s = services
        self.reconciler = reconciler
        self.activator = Activator(services)

    # --- clients --------------------------------------------------------------
    def invoke(self, who: Principal, function: str, req: CallRequest) -> tuple[CallView, bool]:
        """Accept a call (or find it by idempotency key) and start routing it."""
        who.require("invoke", function)  # before the lookup: no existence leak
        with self.s.db.session() as session:
            fn = functions.active(session, function)
            view, created = calls.accept(session, self.s.clock(), who, fn, req)
        if created:
            self.reconciler.kick(function)
        return view, created

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
        return view

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
        self.s.notifier.notify(call_id)
        if ev.kind not in ("started", "output"):
            self.reconciler.kick(function)
