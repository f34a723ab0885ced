"""The ``thaw`` command: a thin assembler of sub-apps, one module per noun.

Each sub-app lives in its own module (``cli/models.py`` …) and is added here
with ``app.add_typer``; nothing else belongs in this file.
"""

from __future__ import annotations

import typer

from cli import (
    bench,
    cache,
    canary,
    functions,
    gc,
    images,
    invoke,
    keys,
    models,
    secrets,
    warm,
    workers,
)
from cli.loadtest import loadtest
from cli.server import server
from cli.up import up
from cli.worker import worker

app = typer.Typer(
    name="thaw",
    no_args_is_help=True,
    help="thaw: serverless GPU functions on your own machines, with fast cold starts.",
)
app.add_typer(models.app, name="models")
app.add_typer(images.app, name="images")
app.command("worker")(worker)
app.add_typer(workers.app, name="workers")
app.add_typer(cache.app, name="cache")
app.command("up")(up)
app.command("server")(server)
app.add_typer(keys.app, name="keys")
app.add_typer(secrets.app, name="secrets")
app.command("deploy")(functions.deploy)
app.add_typer(functions.app, name="functions")
app.add_typer(canary.app, name="canary")
app.command("invoke")(invoke.invoke)
app.add_typer(invoke.calls_app, name="calls")
app.add_typer(bench.app, name="bench")
app.command("warm")(warm.warm)
app.command("loadtest")(loadtest)
app.command("gc")(gc.gc)


if __name__ == "__main__":
    app()
