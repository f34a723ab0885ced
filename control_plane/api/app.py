"""The app factory: ``create_app(settings) -> FastAPI``.

It migrates the database (idempotent), creates the first admin key on an
empty installation (``app.state.bootstrap_admin_key``; also written to
``admin_key_file`` when set), wires the services, and runs the reconcile
loop for the app's lifetime (lifespan). Parts may be injected for tests:
a dispatcher, a clock, a bundle validator.

``thaw server --processes N`` runs N apps behind one port: it migrates and
bootstraps once (``prepare``), then each process builds its app from the
environment (``served_app``) and finds the others in ``THAW_PEER_DIR``
(``control_plane.peers``).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio.to_thread
from fastapi import Depends, FastAPI
from starlette.types import ASGIApp

from control_plane import gil, heap
from control_plane.api import errors
from control_plane.api.fast_invoke import FastInvoke
from control_plane.api.invoke_threads import invoke_threads
from control_plane.api.limits import BodySizeLimit
from control_plane.api.rate_limits import enforce_rate_limit, make_rate_limiter
from control_plane.api.routes import (
    calls,
    canary,
    console,
    functions,
    health,
    invoke,
    keys,
    models,
    openai,
    scaling,
    secrets,
    stats,
    store,
    uploads,
    workers,
)
from control_plane.clock import Clock, system_clock
from control_plane.db import migrate
from control_plane.db.session import Database
from control_plane.dispatch.base import Dispatcher
from control_plane.dispatch.direct import DirectChannel
from control_plane.dispatch.secrets import SecretsDispatcher, secret_box
from control_plane.loop import BackgroundLoop
from control_plane.metrics import Metrics
from control_plane.notifier import InProcessNotifier, Notifier, PeerNotifier
from control_plane.peers import Datagrams, MetricsServer, Peers
from control_plane.services import keys as key_service
from control_plane.services.bundles import BundleValidator, subprocess_validator
from control_plane.services.context import Services
from control_plane.services.invocations import Invocations
from control_plane.services.reconciler import Reconciler
from control_plane.settings import Settings
from control_plane.tracing import open_tracing, tracing_config
from snapshotter.registry import Registry
from snapshotter.stores import open_store


def default_dispatcher(settings: Settings) -> Dispatcher:
    from control_plane.dispatch.celery_app import make_celery
    from control_plane.dispatch.celery_dispatcher import CeleryDispatcher

    app = make_celery(
        settings.broker_url_resolved(), settings.broker_folder(), settings.broker_poll_interval_s
    )
    return CeleryDispatcher(app)


def build_services(
    settings: Settings,
    dispatcher: Dispatcher | None = None,
    clock: Clock = system_clock,
    validate_bundle: BundleValidator | None = None,
) -> Services:
    db = Database(settings.database_url_resolved())
    peers = Peers(settings.peer_dir) if settings.peer_dir is not None else None
    notifier: Notifier = PeerNotifier(peers) if peers is not None else InProcessNotifier()
    principals = key_service.PrincipalCache(clock, settings.auth_cache_ttl_s)
    return Services(
        settings=settings,
        db=db,
        dispatcher=SecretsDispatcher(
            dispatcher or default_dispatcher(settings), db, secret_box(settings)
        ),
        notifier=notifier,
        metrics=Metrics(),
        clock=clock,
        registry_factory=lambda: Registry(open_store(settings.store_config())),
        validate_bundle=validate_bundle or subprocess_validator(settings.deploy_validate_timeout_s),
        tracing=open_tracing(tracing_config(settings, "thaw-control-plane")),
        direct=DirectChannel() if settings.direct_calls else None,
        principals=principals,
        peers=peers,
        # A key revoked through another process is forgotten here at once.
        revocations=Datagrams(peers, "revoke", principals.drop) if peers is not None else None,
    )


def prepare(settings: Settings) -> str | None:
    """What ``create_app`` does once per installation, for a server whose processes
    each create their app: migrate, and make the first admin key (returned) on an
    empty installation."""
    migrate.upgrade(settings.database_url_resolved())
    db = Database(settings.database_url_resolved())
    try:
        return _bootstrap(db, system_clock, settings.admin_key_file)
    finally:
        db.dispose()


def served_app() -> FastAPI:
    """The app of one process of ``thaw server --processes N`` (uvicorn's factory):
    settings from the environment, the installation already prepared."""
    gil.tune()
    app = create_app(Settings(), prepared=True)
    heap.freeze()
    return app


def _bootstrap(db: Database, clock: Clock, path: Path | None) -> str | None:
    with db.session() as s:
        token = key_service.bootstrap_admin(s, clock())
    if token is not None and path is not None:
        _write_secret(path, token)
    return token


def _write_secret(path: Path, token: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")


class ControlPlaneApp(FastAPI):
    """FastAPI, with the common invoke served in front of its whole middleware stack
    (``api.fast_invoke``)."""

    def build_middleware_stack(self) -> ASGIApp:
        return FastInvoke(super().build_middleware_stack())


def create_app(
    settings: Settings,
    *,
    dispatcher: Dispatcher | None = None,
    clock: Clock = system_clock,
    validate_bundle: BundleValidator | None = None,
    run_loop: bool = True,
    prepared: bool = False,
) -> FastAPI:
    """The control plane's app. ``prepared``: ``prepare`` ran for this installation
    already (``thaw server --processes N``), so the app neither migrates nor makes
    the first admin key."""
    if not prepared:
        migrate.upgrade(settings.database_url_resolved())
    services = build_services(settings, dispatcher, clock, validate_bundle)
    reconciler = Reconciler(services)
    loop = BackgroundLoop(reconciler, settings.reconcile_interval_s, settings.server_processes)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # Synchronous and streaming invokes hold a worker thread while they
        # wait; anyio's default of 40 would cap concurrent waiting callers.
        anyio.to_thread.current_default_thread_limiter().total_tokens = invoke.SYNC_THREADS
        if run_loop:
            loop.start()
        peer_metrics = None
        if services.peers is not None:  # a scrape of another process asks for these
            peer_metrics = MetricsServer(services.peers, services.metrics.exposition)
        try:
            yield
        finally:
            if peer_metrics is not None:
                peer_metrics.close()
            services.notifier.close()
            if services.revocations is not None:
                services.revocations.close()
            if run_loop:
                loop.stop()
            app.state.invoke_threads.shutdown(wait=False)
            services.dispatcher.close()
            if services.direct is not None:
                services.direct.close()
            services.tracing.close()
            app.state.rate_limiter.close()
            services.db.dispose()

    # The OpenAPI document is served by routes/health.py behind a key, like
    # everything but /healthz; FastAPI's own open /docs and /openapi.json are off.
    app = ControlPlaneApp(
        title="thaw control plane",
        version="1",
        # thaw traces calls itself (control_plane.tracing); FastAPI's own OpenTelemetry
        # would look up the global providers on every request.
        telemetry={"tracing": False, "metrics": False, "logs": False},
        lifespan=lifespan,
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
    )
    app.state.services = services
    app.state.reconciler = reconciler
    app.state.invocations = Invocations(services, reconciler)
    app.state.invoke_threads = invoke_threads()
    app.state.bootstrap_admin_key = (
        None if prepared else _bootstrap(services.db, clock, settings.admin_key_file)
    )
    app.state.rate_limiter = make_rate_limiter(services)
    errors.install(app)
    for module in (health, keys, models, store, functions, canary, calls, workers):
        app.include_router(module.router)
    app.include_router(invoke.router, dependencies=[Depends(enforce_rate_limit)])
    app.include_router(secrets.router)
    for module in (stats, scaling, uploads, console):  # the web console's needs
        app.include_router(module.router)
    app.include_router(openai.router)  # /openai/v1: LLM functions for OpenAI clients
    app.add_middleware(
        BodySizeLimit,
        max_body_bytes=settings.max_body_bytes,
        path_limits={"/v1/uploads": (settings.max_upload_bytes, "THAW_MAX_UPLOAD_BYTES")},
    )
    return app
