"""The invoke and worker-event use cases: one transaction, then wake and reconcile.

Routers call these; each opens its own session, commits, and only then
notifies waiters and asks the reconciler to act, so nobody is woken to read
state that is not yet committed. A synchronous call may take the fast path
(``services.direct_calls``): routed in the transaction that accepts it and
run over the worker's direct port by the caller's own thread
(``services.direct_runner``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from control_plane import fingerprints
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
    call_access,
    calls,
    canary,
    direct_calls,
    functions,
    replicas,
    worker_health,
    workers,
)
from control_plane.services.activator import Activator
from control_plane.services.call_spans import call_spans, invoke_span
from control_plane.services.calls import CallRequest, CallView
from control_plane.services.combining import Combiner
from control_plane.services.context import Services
from control_plane.services.direct_calls import Claim
from control_plane.services.functions import ActiveVersion
from control_plane.services.keys import Principal
from control_plane.services.reconciler import Reconciler

log = logging.getLogger(__name__)

# Fast-path accepts taken in one transaction at most: a burst's streams share a
# transaction's begin and commit and the direct runner's lock, while its hold stays
# short enough for the ends recorded under it.
MAX_ACCEPTS_AT_ONCE = 16


class Invocations:
    def __init__(self, services: Services, reconciler: Reconciler) -> None:
        self.s = services
        self.reconciler = reconciler
        self.activator = Activator(services)
        self.direct = reconciler.direct
        self._breakers = worker_health.BreakerCache()
        self.versions = functions.VersionCache()  # one per database: read by routes too
        s = services.settings
        self._breaker_settings = (s.worker_failure_threshold, s.worker_probe_interval_s)
        self._accepts = Combiner(self._accept_batch, MAX_ACCEPTS_AT_ONCE)

    # --- clients --------------------------------------------------------------
    def invoke(
        self,
        who: Principal,
        function: str,
        req: CallRequest | Callable[[ActiveVersion], CallRequest],
        *,
        direct: bool = False,
        background: bool = False,
    ) -> tuple[CallView, bool]:
        """Accept a call (or find it by idempotency key) and start routing it. ``req``
        may be made from the version the call is accepted on (active or canary), in
        the accepting transaction: a request whose meaning depends on the function's
        spec (an OpenAI route's model and limits) costs no read of its own; what it
        raises ends the request with nothing written.

        ``direct``: the caller will wait for the end; a new call that finds a
        ready replica with room is run here, over the worker's direct port,
        and this returns once it ended (the call as it ended) or was handed back
        to the queue. With ``background`` too, such a call runs on a thread of its
        own and this returns at once (a stream reads its outputs as they come, in
        memory: ``services.live_outputs``): no broker hop, no HTTP post or database
        write per output.
        """
        who.require("invoke", function)  # before the lookup: no existence leak
        fast = direct and self.s.direct is not None
        item = _Accept(who, function, req)
        accepted = self._accepts.submit(item) if fast else self._accept_alone(item, fast=False)
        view, created, claim = accepted
        if claim is not None and background:
            self.s.live.open(claim.call_id)  # its outputs go to the caller's stream in memory
            self.direct.start_or_queue(claim)
        elif claim is not None:
            view = self.direct.run(claim) or view  # the call as it ended, when it did
        elif created:
            self.reconciler.kick(function)
        return view, created

    def _accept_batch(self, items: Sequence[_Accept]) -> list[_Accepted | BaseException]:
        """Fast-path accepts that arrived together, in one transaction under the direct
        runner's lock (``combining.Combiner``): each call routed in turn, so each sees
        the replicas' room the ones before it took. An item that fails before anything
        is written for it (no such function, a request its builder refuses, an unknown
        adapter) fails alone. A request with an idempotency key is accepted alone (its
        insert must be the transaction's only write), after the batch. Should the
        transaction itself fail, it is rolled back and every item is accepted again
        alone, with the request already built (its rate limits charged once)."""
        outcomes: list[_Accepted | BaseException | None] = [None] * len(items)
        try:
            with self.direct.lock, self.s.db.session() as session:
                for i, item in enumerate(items):
                    try:
                        self._prepare(session, item)
                    except SQLAlchemyError:
                        raise
                    except Exception as e:  # nothing written for it: its caller's error
                        outcomes[i] = e
                        continue
                    if item.keyed:
                        continue  # after the batch, alone
                    outcomes[i] = self._accept_in(session, item, fast=True)
        except Exception:
            log.warning("a batch of %d accepts failed; each is accepted alone", len(items))
            outcomes = [o if isinstance(o, Exception) else None for o in outcomes]
        done: list[_Accepted | BaseException] = []
        for item, outcome in zip(items, outcomes, strict=True):
            if outcome is None:
                try:
                    outcome = self._accept_alone(item, fast=True)
                except Exception as e:
                    outcome = e
            done.append(outcome)
        return done

    def _accept_alone(self, item: _Accept, *, fast: bool) -> _Accepted:
        with self.direct.lock if fast else contextlib.nullcontext(), self.s.db.session() as session:
            self._prepare(session, item)
            return self._accept_in(session, item, fast=fast)

    def _prepare(self, session: Session, item: _Accept) -> None:
        """The version ``item`` is accepted on and its request, once (what raises here
        writes nothing): a second try keeps both."""
        if item.fn is None:
            item.fn = canary.for_call(session, item.function, self.versions)  # active or canary
        if not isinstance(item.req, CallRequest):
            item.req = item.req(item.fn)
        calls.check_request(item.who, item.fn, item.req, self.s.registry)

    def _accept_in(self, session: Session, item: _Accept, *, fast: bool) -> _Accepted:
        fn, req = item.fn, item.req
        assert fn is not None and isinstance(req, CallRequest)
        claim: Claim | None = None
        now = self.s.clock()
        with calls.accepting(session, now, item.who, fn, req, self.s.registry) as (row, created):
            if fast and created:  # routed before it is written
                breakers = self._breakers.get(session, now, *self._breaker_settings)
                claim = direct_calls.claim(session, self.s.metrics, fn, row, now, breakers)
        return calls.view(row), created, claim

    def get(self, who: Principal, call_id: str) -> CallView:
        """The call, to the key that made it or an admin key (``services.call_access``)."""
        who.require("invoke")  # before the lookup: no existence leak
        with self.s.db.session() as session:
            view = call_access.visible_call(session, who, call_id)
        who.require("invoke", view.function)
        return view

    def list_calls(self, who: Principal, function: str | None, limit: int) -> list[CallView]:
        """The latest calls this key may see, newest first."""
        who.require("invoke", function)
        with self.s.db.session() as session:
            return call_access.list_visible(session, who, function, limit)

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

    # --- workers --------------------------------------------------------------
    def register(self, msg: WorkerRegister) -> WorkerRegistered:
        with self.s.db.session() as session:
            server = fingerprints.of_settings(self.s.settings)
            row, touched = workers.register(session, self.s.metrics, self.s.clock(), msg, server)
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
            batching.observe(self.s.metrics, function, ev)
        self.s.notifier.notify(call_id)
        if ev.kind not in ("started", "output"):
            self.reconciler.kick(function)
            self.direct.trace_final(call_id)


@dataclass
class _Accept:
    """A call to accept: the function's version and the request, once made."""

    who: Principal
    function: str
    req: CallRequest | Callable[[ActiveVersion], CallRequest]
    fn: ActiveVersion | None = None

    @property
    def keyed(self) -> bool:
        return isinstance(self.req, CallRequest) and self.req.idempotency_key is not None


# The call as accepted, whether this request made it, and its claim on a replica.
_Accepted = tuple[CallView, bool, Claim | None]
