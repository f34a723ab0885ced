"""How ``thaw functions ls/show`` draw a function's health (``FunctionPublic.health``)."""

from __future__ import annotations

import time
from typing import Any

from rich.markup import escape


def cell(fn: dict[str, Any]) -> str:
    """The ``health`` column: ``ok``, or ``failing`` in red."""
    state = str((fn.get("health") or {}).get("state", "ok"))
    return "[red]failing[/red]" if state == "failing" else state


def note(fn: dict[str, Any], now: float | None = None) -> str | None:
    """One line naming the last failed start and when; None while the function is ok."""
    health = fn.get("health") or {}
    if health.get("state") != "failing":
        return None
    at = health.get("last_error_at")
    ago = "" if at is None else f" {max(0.0, (now or time.time()) - float(at)):.0f} s ago"
    error = escape(str(health.get("last_error") or "no error was reported"))
    return f"[red]failing[/red]: its last replica start failed{ago}: {error}"
