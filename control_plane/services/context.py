"""What every service needs, built once per process and passed down."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from control_plane.clock import Clock
from control_plane.db.session import Database
from control_plane.dispatch.base import Dispatcher
from control_plane.dispatch.direct import DirectChannel
from control_plane.metrics import Metrics
from control_plane.notifier import Notifier
from control_plane.peers import Datagrams, Peers
from control_plane.services.bundles import BundleValidator
from control_plane.services.keys import PrincipalCache
from control_plane.services.live_outputs import LiveOutputs
from control_plane.settings import Settings
from control_plane.tracing import NO_TRACING, Tracing
from snapshotter.registry import Registry


@dataclass
class Services:
    settings: Settings
    db: Database
    dispatcher: Dispatcher
    notifier: Notifier
    metrics: Metrics
    clock: Clock
    registry_factory: Callable[[], Registry]
    validate_bundle: BundleValidator
    # Serializes scaling and dispatch decisions within this process, so two
    # threads do not both start a replica for the same queued call.
    reconcile_lock: threading.RLock = field(default_factory=threading.RLock)
    # Why the latest replica start of a function could not be placed (cleared
    # once one is); a caller whose deadline passes is told this reason.
    placement_errors: dict[str, str] = field(default_factory=dict)
    # Spans of calls (control_plane.tracing); NO_TRACING without an OTLP endpoint.
    tracing: Tracing = NO_TRACING
    # Warm synchronous calls straight to the worker (None: every call is queued).
    direct: DirectChannel | None = None
    # Outputs of direct-run streams, handed to their readers in memory.
    live: LiveOutputs = field(default_factory=LiveOutputs)
    # Keys verified in the last moment (THAW_AUTH_CACHE_TTL_S); None: read every time.
    principals: PrincipalCache | None = None
    # The other processes of this server (``thaw server --processes N``); None: alone.
    peers: Peers | None = None
    # Tells those processes of each key revoked here (``peers``: ``<pid>.revoke``).
    revocations: Datagrams | None = None
    _registry: Registry | None = None

    @property
    def registry(self) -> Registry:
        if self._registry is None:
            self._registry = self.registry_factory()
        return self._registry

    @property
    def worker_lost_after_s(self) -> float:
        return self.settings.heartbeat_interval_s * self.settings.worker_lost_after_heartbeats
