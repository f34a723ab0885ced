"""``thaw cache``: this worker's own tiers, the disk chunk cache and the host-RAM tier.

``thaw cache verify`` re-hashes every entry of both with the content digests
(``snapshotter.tier_verify``), where loads check only the checksum each tier
recorded. The tiers are the ones a worker on this machine uses:
``THAW_CACHE_DIR`` (default ``THAW_HOME/cache``) and ``THAW_RAM_TIER_DIR``
(default ``/dev/shm/thaw-<home hash>``; skipped when
``THAW_RAM_TIER_MAX_BYTES=0``). Exit codes: 0 sound, 1 damaged entries were
found (each named, and dropped: the next load fetches them again), 2 the
snapshotter failed.
"""

from __future__ import annotations

from collections.abc import Callable

import typer
from rich.console import Console
from rich.markup import escape

from cli.models import EXIT_CORRUPT, snapshotter_errors
from cli.progress import human_bytes, transfer_bar
from control_plane.settings import Settings
from snapshotter.cache import DiskCache
from snapshotter.ram_tier import RamTier
from snapshotter.tier_verify import Progress, TierCheck, verify_cache, verify_tier

app = typer.Typer(no_args_is_help=True, help="This worker's disk cache and host-RAM tier.")
out = Console(highlight=False)
err = Console(stderr=True, highlight=False)


@app.command("verify")
def verify_cmd() -> None:
    """Re-hash the disk cache and the RAM tier with the content digests; drop damaged
    entries, and exit 1 naming each one."""
    settings = Settings()
    checks: list[TierCheck] = []
    with snapshotter_errors():
        cache_config = settings.cache_config()
        if (cache_config.directory / "chunks").is_dir():
            cache = DiskCache(cache_config)
            where = f"disk cache {cache_config.directory}"
            checks.append(_checked(where, cache.total_bytes, lambda p: verify_cache(cache, p)))
        else:
            out.print(f"no disk cache at {cache_config.directory}", soft_wrap=True)
        tier_config = settings.ram_tier_config()
        if tier_config.max_bytes > 0 and (tier_config.directory / "entries").is_dir():
            tier = RamTier(tier_config)
            where = f"RAM tier {tier_config.directory}"
            total_bytes = tier.inventory().total_bytes
            checks.append(_checked(where, total_bytes, lambda p: verify_tier(tier, p)))
        else:
            out.print(f"no RAM tier at {tier_config.directory}", soft_wrap=True)
    for check in checks:
        _print_check(check)
    if any(not c.ok for c in checks):
        raise typer.Exit(EXIT_CORRUPT)


def _checked(
    description: str, total_bytes: int, verify: Callable[[Progress], TierCheck]
) -> TierCheck:
    """Run one tier's verification under a progress bar of the bytes it re-hashes."""
    with transfer_bar(out, description) as update:
        done_bytes = 0

        def progress(nbytes: int) -> None:
            nonlocal done_bytes
            done_bytes += nbytes
            update(done_bytes, total_bytes)

        check = verify(progress)
        update(total_bytes, total_bytes, f"{check.entries} entries")
    return check


def _print_check(check: TierCheck) -> None:
    for damaged in check.damaged:
        err.print(
            f"[red]damaged[/red] {check.tier} entry {damaged.digest}: "
            f"{escape(damaged.reason)}; dropped",
            soft_wrap=True,
        )
    verdict = "[green]ok[/green]" if check.ok else f"[red]{len(check.damaged)} damaged[/red]"
    recorded = f", {check.recorded} older entries given checksums" if check.recorded else ""
    if check.older:
        recorded += f", {check.older} older entries left for the next load to record"
    out.print(
        f"{check.tier}: {check.entries} entries, {human_bytes(check.bytes_checked)} "
        f"re-hashed{recorded}, {verdict}",
        soft_wrap=True,
    )
