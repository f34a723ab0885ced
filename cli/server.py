"""``thaw server``: run the control plane (API, reconcile loop) with uvicorn."""

from __future__ import annotations

import logging
import os
import tempfile
from typing import Annotated, Any

import typer

from cli.control import fail, out
from control_plane.settings import Settings

LOG_FORMAT = "%(asctime)s server %(message)s"
PROCESS_LOG_FORMAT = "%(asctime)s server[%(process)d] %(message)s"  # one of several


def server(
    host: Annotated[str | None, typer.Option(help="bind address (THAW_SERVER_HOST)")] = None,
    port: Annotated[int | None, typer.Option(help="port (THAW_SERVER_PORT)")] = None,
    processes: Annotated[
        int | None,
        typer.Option(min=1, help="control-plane processes behind the port (THAW_SERVER_PROCESSES)"),
    ] = None,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING")] = "INFO",
) -> None:
    """Migrate the database, print the first admin key on a fresh install, and serve.

    With several processes, each is a whole control plane (API and reconcile
    loop) on the same port; the kernel spreads connections over them. They wake
    each other's waiting callers and answer ``/metrics`` for all of them.
    """
    from control_plane.db.reach import DatabaseUnreachableError

    try:
        _serve(host, port, processes, log_level)
    except DatabaseUnreachableError as exc:
        raise fail(str(exc)) from None


def _serve(host: str | None, port: int | None, processes: int | None, log_level: str) -> None:
    import uvicorn

    from control_plane import gil, heap
    from control_plane.api.app import create_app, prepare

    settings = Settings()
    processes = processes or settings.server_processes
    # --processes wins over THAW_SERVER_PROCESSES: each process paces its reconcile by it.
    settings = settings.model_copy(update={"server_processes": processes})
    host, port = host or settings.server_host, port or settings.server_port
    logging.basicConfig(level=log_level.upper(), format=LOG_FORMAT)
    # A line per request at INFO; above it uvicorn would still format each, unshown.
    access_log = logging.getLevelName(log_level.upper()) <= logging.INFO
    if processes == 1:
        gil.tune()
        app = create_app(settings)
        heap.freeze()
        _announce(settings, app.state.bootstrap_admin_key)
        uvicorn.run(app, host=host, port=port, log_level=log_level.lower(), access_log=access_log)
        return
    _announce(settings, prepare(settings))
    with tempfile.TemporaryDirectory(prefix="thaw-peers-") as peer_dir:
        # The processes' settings read these.
        os.environ["THAW_PEER_DIR"] = peer_dir
        os.environ["THAW_SERVER_PROCESSES"] = str(processes)
        uvicorn.run(
            "control_plane.api.app:served_app",
            factory=True,
            workers=processes,
            host=host,
            port=port,
            log_level=log_level.lower(),
            access_log=access_log,
            log_config=_log_config(log_level),
        )


def _announce(settings: Settings, token: str | None) -> None:
    if token is None:
        return
    out.print("[bold]First start: an admin API key was created. It is shown only once:[/bold]")
    out.print(token, soft_wrap=True)
    if settings.admin_key_file is not None:
        out.print(f"(also written to {settings.admin_key_file}, mode 600)")


def _log_config(level: str) -> dict[str, Any]:
    """Every process logs as the single one does, with its pid."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"plain": {"format": PROCESS_LOG_FORMAT}},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "plain"}},
        "root": {"level": level.upper(), "handlers": ["stderr"]},
    }
