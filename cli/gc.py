"""``thaw gc``: delete what no tag or lease references from a store (``snapshotter.gc``).

``--dry-run`` prints the plan (every object that would go, with its size and
age) and deletes nothing. Exit codes: 0 done, 2 the snapshotter refused or
failed (one red line); a referenced document that cannot be read stops GC
before it deletes anything.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from cli.control import fail
from cli.models import StoreOption, snapshotter_errors
from cli.progress import human_bytes
from cli.store import open_registry
from control_plane.settings import Settings
from snapshotter.digest import is_digest
from snapshotter.gc import (
    DEFAULT_BATCH_SIZE,
    GcPlan,
    SweepProgress,
    SweepResult,
    plan_gc,
    sweep,
)
from snapshotter.gc_mark import Live, Roots, classify
from snapshotter.registry import Registry

out = Console(highlight=False)
# A plan longer than this is summarised after its first rows.
_MAX_ROWS = 200


def gc(
    store: StoreOption = None,
    grace_s: Annotated[
        float | None,
        typer.Option(min=0, help="keep objects younger than this (default: THAW_GC_GRACE_S, 1 h)"),
    ] = None,
    dry_run: Annotated[bool, typer.Option(help="show what would go; delete nothing")] = False,
    batch_size: Annotated[
        int, typer.Option(min=1, help="objects per batch; tags and leases re-read before each")
    ] = DEFAULT_BATCH_SIZE,
    keep: Annotated[
        list[str] | None,
        typer.Option(help="a manifest digest to keep though no tag names it (repeatable)"),
    ] = None,
) -> None:
    """Delete chunks, manifests, layers, images and profiles nothing references."""
    settings = Settings()
    grace = settings.gc_grace_s if grace_s is None else grace_s
    extra = keep or []
    for digest in extra:
        if not is_digest(digest):
            raise fail(f"--keep {digest!r} is not a digest; give blake3:<64 hex digits>")
    with snapshotter_errors():
        registry = open_registry(settings, store)
        plan, roots, live = plan_gc(registry, grace_s=grace, extra_manifests=extra)
        if dry_run:
            _print_plan(plan)
            return
        if not plan.objects:
            out.print(f"nothing to delete in {registry.store.url} ({plan.live_objects} kept)")
            return
        result = _sweep_with_progress(registry, plan, roots, live, batch_size, extra)
    out.print(
        f"deleted {result.deleted} objects ({human_bytes(result.bytes_deleted)}) from "
        f"{registry.store.url}; {result.kept} planned but found referenced and kept; "
        f"plan {plan.key}",
        soft_wrap=True,
    )


def _sweep_with_progress(
    registry: Registry,
    plan: GcPlan,
    roots: Roots,
    live: Live,
    batch_size: int,
    extra: list[str],
) -> SweepResult:
    with _sweep_bar() as bar:
        task = bar.add_task("gc", total=len(plan.objects), freed="")

        def on_progress(p: SweepProgress) -> None:
            bar.update(task, completed=p.objects_done, freed=human_bytes(p.bytes_deleted))

        return sweep(
            registry,
            plan,
            roots,
            live,
            batch_size=batch_size,
            extra_manifests=extra,
            progress=on_progress,
        )


def _sweep_bar() -> Progress:
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("objects, {task.fields[freed]} freed"),
    )
    return Progress(*columns, console=out, transient=False)


def _print_plan(plan: GcPlan) -> None:
    if not plan.objects:
        out.print(f"nothing would be deleted ({plan.live_objects} objects kept)")
        return
    table = Table("KIND", "KEY", "SIZE", "AGE", title=f"gc --dry-run: grace {plan.grace_s:g} s")
    for obj in plan.objects[:_MAX_ROWS]:
        named = classify(obj.key)
        age_s = plan.created_at_s - obj.modified_s
        table.add_row(named[0] if named else "?", obj.key, human_bytes(obj.size_bytes), _age(age_s))
    out.print(table)
    if len(plan.objects) > _MAX_ROWS:
        out.print(f"… and {len(plan.objects) - _MAX_ROWS} more")
    out.print(
        f"would delete {len(plan.objects)} objects ({human_bytes(plan.size_bytes)}); "
        f"{plan.live_objects} kept"
    )


def _age(age_s: float) -> str:
    if age_s < 120:
        return f"{age_s:.0f} s"
    if age_s < 7200:
        return f"{age_s / 60:.0f} min"
    return f"{age_s / 3600:.1f} h"
