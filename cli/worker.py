"""``thaw worker``: run the worker agent on this machine."""

from __future__ import annotations

import logging

import typer

from cli.control import fail
from control_plane.settings import Settings


def worker(
    server_url: str | None = typer.Option(None, help="control plane URL (THAW_SERVER_URL)"),
    api_key: str | None = typer.Option(None, help="key of scope worker (THAW_API_KEY)"),
    log_level: str = typer.Option("INFO", help="DEBUG, INFO, WARNING"),
) -> None:
    """Register with the control plane, run replicas, until Ctrl-C or SIGTERM."""
    from control_plane import gil
    from worker.bootstrap import MissingKeyError, serve
    from worker.control_client import ControlPlaneError

    gil.tune()
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s worker %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per event is noise
    overrides = {k: v for k, v in {"server_url": server_url, "api_key": api_key}.items() if v}
    settings = Settings(**overrides)  # type: ignore[arg-type]
    try:
        serve(settings)
    except (MissingKeyError, ControlPlaneError) as exc:
        raise fail(str(exc)) from None
