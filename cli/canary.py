"""``thaw canary status/promote/abort NAME``: a canary deployed with
``thaw deploy DIR --canary PCT`` takes that share of calls; these commands
compare it with the active version and end it (``control_plane.services.canary``)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.table import Table

from cli.control import check, client, out
from control_plane.settings import Settings

app = typer.Typer(no_args_is_help=True, help="Compare, promote or abort a canary version.")


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.1f}%"


ROWS: list[tuple[str, Any]] = [
    ("calls", lambda s: str(s["calls"])),
    ("p50 ms", lambda s: _ms(s["latency"]["p50_ms"])),
    ("p95 ms", lambda s: _ms(s["latency"]["p95_ms"])),
    ("p99 ms", lambda s: _ms(s["latency"]["p99_ms"])),
    ("first output p50 ms", lambda s: _ms(s["first_output"]["p50_ms"])),
    ("first output p95 ms", lambda s: _ms(s["first_output"]["p95_ms"])),
    ("first output p99 ms", lambda s: _ms(s["first_output"]["p99_ms"])),
    ("error rate", lambda s: _pct(s["error_rate"])),
    ("cold-start rate", lambda s: _pct(s["cold_start_rate"])),
]


def status_table(status: dict[str, Any]) -> Table:
    """Old and new side by side, one row per measure."""
    active, canary = status["active"], status["canary"]
    since = datetime.fromtimestamp(status["started_at"], UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    table = Table(
        "",
        f"v{active['version']} (active)",
        f"v{canary['version']} (canary, {status['weight_pct']:g}%)",
        title=f"{status['function']}: calls since {since}",
    )
    for label, cell in ROWS:
        table.add_row(label, cell(active), cell(canary))
    return table


@app.command("status")
def status(
    name: str,
    window: Annotated[int, typer.Option(help="at most this many latest calls per version")] = 1000,
) -> None:
    """The active version and the canary over the same window: latency, first output,
    errors, cold starts."""
    with client(Settings()) as c:
        body = check(c.get(f"/v1/functions/{name}/canary", params={"window": window}))
    out.print(status_table(body))


@app.command("promote")
def promote(name: str) -> None:
    """Make the canary the active version (the old version's replicas drain)."""
    with client(Settings()) as c:
        fn = check(c.post(f"/v1/functions/{name}/canary/promote"))
    out.print(f"{name}: version {fn['version']} is now active")


@app.command("abort")
def abort(name: str) -> None:
    """Drop the canary: every call goes to the active version again."""
    with client(Settings()) as c:
        fn = check(c.post(f"/v1/functions/{name}/canary/abort"))
    out.print(f"{name}: canary aborted; version {fn['version']} takes every call")
