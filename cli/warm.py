"""``thaw warm NAME [--replicas N] [--wait]``: prepare replicas before traffic arrives.

The replicas then live ``idle_timeout_s`` from the moment they are ready
(``min_replicas`` keeps them for good).
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer

from cli.control import check, client, fail, out
from control_plane.settings import Settings

POLL_INTERVAL_S = 0.2


def warm(
    name: str,
    replicas: Annotated[int, typer.Option("--replicas", "-n", min=1, help="live replicas")] = 1,
    wait: Annotated[bool, typer.Option("--wait", help="return once they are ready")] = False,
    timeout_s: Annotated[float, typer.Option(help="how long --wait waits")] = 300.0,
) -> None:
    """Start replicas of NAME until N are live (exit 2 when none could start)."""
    with client(Settings()) as c:
        r = c.post(f"/v1/functions/{name}/warm", json={"replicas": replicas})
        result = check(r, ok=(202,))
        started = result.get("started_replica_ids", [])
        out.print(f"{name}: {result['live_replicas']} live, {len(started)} started")
        if result["live_replicas"] < replicas:
            out.print(f"[yellow]only {result['live_replicas']} of {replicas} could be placed[/]")
        if wait:
            ready = _wait_ready(c, name, min(replicas, result["live_replicas"]), timeout_s)
            out.print(f"{name}: {ready} ready")


def _wait_ready(c: Any, name: str, wanted: int, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while True:
        stats = check(c.get(f"/v1/functions/{name}/stats"))
        ready = int(stats["replicas"].get("ready", 0))
        if ready >= wanted:
            return ready
        if time.monotonic() >= deadline:
            raise fail(f"{ready} of {wanted} replicas of {name} ready after {timeout_s:g} s")
        time.sleep(POLL_INTERVAL_S)
