"""``thaw functions scale NAME``: change a deployed function's scaling in place.

Only the options given change; the others keep their values (``PATCH
/v1/functions/NAME/scaling``). The active version is edited, no new version
is made, so warm replicas stay. The resulting scaling is printed.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from cli.control import check, client, fail, out
from control_plane.settings import Settings


def scale(
    name: Annotated[str, typer.Argument(help="the function's name")],
    min_replicas: Annotated[
        int | None,
        typer.Option("--min", min=0, max=64, help="replicas kept running even without calls"),
    ] = None,
    max_replicas: Annotated[
        int | None, typer.Option("--max", min=0, max=64, help="replicas at most")
    ] = None,
    idle_timeout_s: Annotated[
        float | None,
        typer.Option(min=0, max=86400, help="seconds an idle replica above --min lives"),
    ] = None,
    target_concurrency: Annotated[
        int | None,
        typer.Option(min=1, max=1024, help="calls in flight per replica before scaling up"),
    ] = None,
) -> None:
    """Change NAME's scaling; options not given keep their current values."""
    change = {
        "min_replicas": min_replicas,
        "max_replicas": max_replicas,
        "idle_timeout_s": idle_timeout_s,
        "target_concurrency": target_concurrency,
    }
    body = {k: v for k, v in change.items() if v is not None}
    if not body:
        raise fail("nothing to change: give --min, --max, --idle-timeout-s or --target-concurrency")
    with client(Settings()) as c:
        fn = check(c.patch(f"/v1/functions/{name}/scaling", json=body))
    out.print(f"{name} version {fn['version']}: {describe(fn['spec']['scaling'])}")


def describe(scaling: dict[str, Any]) -> str:
    """``min 0, max 3, idle timeout 300 s, target concurrency 1``."""
    return (
        f"min {scaling['min_replicas']}, max {scaling['max_replicas']}, "
        f"idle timeout {scaling['idle_timeout_s']:g} s, "
        f"target concurrency {scaling['target_concurrency']}"
    )
