"""``thaw keys``: create, list and revoke API keys (needs an admin key)."""

from __future__ import annotations

import enum
from typing import Annotated

import typer
from rich.table import Table

from cli.control import check, client, out
from control_plane.settings import Settings

app = typer.Typer(no_args_is_help=True, help="Create, list and revoke API keys.")


class Scope(enum.StrEnum):
    admin = "admin"
    deploy = "deploy"
    invoke = "invoke"
    worker = "worker"


@app.command("create")
def create(
    scope: Annotated[list[Scope], typer.Option("--scope", help="repeatable")],
    name: Annotated[str, typer.Option(help="a label for people")] = "",
    function: Annotated[str | None, typer.Option(help="limit the key to one function")] = None,
    rate: Annotated[float | None, typer.Option(help="invokes per second (429 above)")] = None,
    burst: Annotated[
        int | None, typer.Option(help="invokes at once (default: 1 s of --rate)")
    ] = None,
) -> None:
    """Create a key; its token is printed once."""
    body = {
        "scopes": [s.value for s in scope],
        "name": name,
        "function": function,
        "rate_per_s": rate,
        "rate_burst": burst,
    }
    with client(Settings()) as c:
        key = check(c.post("/v1/keys", json=body))
    out.print(f"key {key['id']} ({', '.join(key['scopes'])}); store this token now:")
    out.print(key["token"], soft_wrap=True)


@app.command("ls")
def ls() -> None:
    """List keys (never their secrets)."""
    with client(Settings()) as c:
        keys = check(c.get("/v1/keys"))
    table = Table("id", "name", "scopes", "function", "rate", "revoked")
    for k in keys:
        revoked = "yes" if k["revoked_at"] else ""
        rate = f"{k['rate_per_s']:g}/s burst {k['rate_burst']}" if k.get("rate_per_s") else ""
        scopes = ",".join(k["scopes"])
        table.add_row(k["id"], k["name"], scopes, k["function"] or "", rate, revoked)
    out.print(table)


@app.command("revoke")
def revoke(key_id: str) -> None:
    """Revoke a key by id; requests with it get 401 from now on."""
    with client(Settings()) as c:
        check(c.delete(f"/v1/keys/{key_id}"))
    out.print(f"revoked {key_id}")
