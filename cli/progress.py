"""Terminal output shared by commands: a transfer progress bar and human sizes."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def human_bytes(size_bytes: int) -> str:
    """``1536`` → ``1.5 KiB``; exact bytes below 1 KiB."""
    value = float(size_bytes)
    for unit in _UNITS:
        if abs(value) < 1024 or unit == _UNITS[-1]:
            return f"{size_bytes} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


class TransferUpdate(Protocol):
    def __call__(self, done_bytes: int, total_bytes: int, note: str = "") -> None: ...


@contextmanager
def transfer_bar(console: Console, description: str) -> Iterator[TransferUpdate]:
    """A bar showing bytes, rate and a free-text note (e.g. chunks deduplicated).

    Yields ``update(done_bytes, total_bytes, note)``; call it from one thread.
    The bar appears on the first update, so input refused before any transfer
    starts prints only its error.
    """
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(binary_units=True),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[note]}"),
    )
    progress = Progress(*columns, console=console, transient=False)
    task = progress.add_task(description, total=None, note="")

    def update(done_bytes: int, total_bytes: int, note: str = "") -> None:
        if not progress.live.is_started:
            progress.start()
        progress.update(task, completed=done_bytes, total=total_bytes, note=note)

    try:
        yield update
    finally:
        if progress.live.is_started:
            progress.stop()
