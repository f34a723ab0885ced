"""``thaw secrets``: set, list and remove function secrets (needs scope deploy).

A function names the secrets it needs in its spec (``secrets = ["HF_TOKEN"]``);
replicas get them as environment variables. Values are never printed back.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.table import Table

from cli.control import check, client, out
from control_plane.settings import Settings

app = typer.Typer(no_args_is_help=True, help="Set, list and remove function secrets.")


@app.command("set")
def set_(
    name: Annotated[str, typer.Argument(help="an environment variable name, e.g. HF_TOKEN")],
    value: Annotated[str, typer.Argument(help="the value; - reads it from stdin")],
) -> None:
    """Create or replace a secret; replicas started from now on get the new value."""
    if value == "-":
        value = sys.stdin.read().rstrip("\n")
    with client(Settings()) as c:
        check(c.put(f"/v1/secrets/{name}", json={"value": value}))
    out.print(f"secret {name} set; functions that list it get it on their next replica start")


@app.command("ls")
def ls() -> None:
    """List secret names (never their values)."""
    with client(Settings()) as c:
        rows = check(c.get("/v1/secrets"))
    table = Table("name", "updated")
    for r in rows:
        table.add_row(r["name"], f"{r['updated_at']:.0f}")
    out.print(table)


@app.command("rm")
def rm(name: str) -> None:
    """Remove a secret; replicas already running keep the value they were started with."""
    with client(Settings()) as c:
        check(c.delete(f"/v1/secrets/{name}"))
    out.print(f"removed secret {name}")
