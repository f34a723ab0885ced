"""The headers every invoke response carries: call id, cold or warm, Server-Timing."""

from __future__ import annotations

import re
import time

from control_plane.services.calls import CallView

_TOKEN = re.compile(r"[^A-Za-z0-9_-]")


def server_timing(*parts: dict[str, float]) -> str:
    """``name;dur=ms`` entries (RFC Server-Timing), phases first, then call timings;
    a name in two parts (a cold call's ``first_output``) is given once, the first."""
    entries: dict[str, str] = {}
    for d in parts:
        for name, ms in d.items():
            token = _TOKEN.sub("_", name)
            entries.setdefault(token, f"{token};dur={float(ms):.1f}")
    return ", ".join(entries.values())


def call_headers(
    call_id: str,
    cold: bool,
    phases_ms: dict[str, float],
    timings_ms: dict[str, float] | None = None,
) -> dict[str, str]:
    headers = {"X-Thaw-Call-Id": call_id, "X-Thaw-Cold": "true" if cold else "false"}
    timing = server_timing(phases_ms, timings_ms or {})
    if timing:
        headers["Server-Timing"] = timing
    return headers


def headers_for(view: CallView, since: float | None = None) -> dict[str, str]:
    """Headers for ``view``; with ``since`` (a ``perf_counter`` reading at the start
    of the request), Server-Timing also says how long this response took here
    (``control_plane``), so the header is present even before any phase ran."""
    handled = {} if since is None else {"control_plane": (time.perf_counter() - since) * 1000}
    return call_headers(view.id, view.cold, view.phases_ms, {**view.timings_ms, **handled})
