"""``thaw server``: run the control plane (API, reconcile loop) with uvicorn."""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from cli.control import out
from control_plane.settings import Settings


def server(
    host: Annotated[str | None, typer.Option(help="bind address (THAW_SERVER_HOST)")] = None,
    port: Annotated[int | None, typer.Option(help="port (THAW_SERVER_PORT)")] = None,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING")] = "INFO",
) -> None:
    """Migrate the database, print the first admin key on a fresh install, and serve."""
    import uvicorn

    from control_plane import gil
    from control_plane.api.app import create_app

    gil.tune()
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s server %(message)s")
    settings = Settings()
    app = create_app(settings)
    token = app.state.bootstrap_admin_key
    if token is not None:
        out.print("[bold]First start: an admin API key was created. It is shown only once:[/bold]")
        out.print(token, soft_wrap=True)
        if settings.admin_key_file is not None:
            out.print(f"(also written to {settings.admin_key_file}, mode 600)")
    uvicorn.run(
        app,
        host=host or settings.server_host,
        port=port or settings.server_port,
        log_level=log_level.lower(),
    )
