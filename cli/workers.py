"""``thaw workers ls``: the workers the control plane knows, with their devices,
memory, warm pool, replicas and health (needs an admin key)."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer
from rich.table import Table

from cli.control import check, client, out, print_json
from control_plane.settings import Settings

app = typer.Typer(no_args_is_help=True, help="See the workers and what runs on them.")


@app.command("ls")
def ls(
    as_json: Annotated[bool, typer.Option("--json", help="the full records, as JSON")] = False,
) -> None:
    """Every worker: health, devices, free memory, warm pool size, live replicas by
    function and version, and how long since its last heartbeat."""
    with client(Settings()) as c:
        workers = check(c.get("/v1/workers"))
    if as_json:
        print_json(workers)
        return
    table = Table("worker", "id", "health", "devices", "free memory", "pool", "replicas", "seen")
    now = time.time()
    for w in workers:
        table.add_row(
            w["name"],
            w["id"][:12],
            _health(w),
            ", ".join(f"{d['kind']} {d['name']}" for d in w["devices"]),
            f"{w['free_memory_bytes'] / 2**30:.1f} / {w['memory_bytes'] / 2**30:.1f} GiB",
            str(w["pool_size"]),
            _replicas(w["replicas"]),
            f"{max(0.0, now - w['last_heartbeat_at']):.0f} s ago",
        )
    out.print(table)


def _health(w: dict[str, Any]) -> str:
    if w["lost"]:
        return "[red]lost[/red]"
    return "healthy" if w["healthy"] else "[yellow]unhealthy[/yellow]"


def _replicas(replicas: list[dict[str, Any]]) -> str:
    """``textgen v2: 2 ready, 1 starting`` per function and version, one per line."""
    counts: dict[tuple[str, int], dict[str, int]] = {}
    for r in replicas:
        states = counts.setdefault((r["function"], r["version"]), {})
        states[r["state"]] = states.get(r["state"], 0) + 1
    lines = [
        f"{fn} v{version}: " + ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
        for (fn, version), states in sorted(counts.items())
    ]
    return "\n".join(lines) or "-"
