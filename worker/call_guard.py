"""What a call may send back: results capped in size, secrets never in clear.

Every ``CallEvent`` the worker reports goes through :func:`guard` first:

* a final result larger than ``max_result_bytes`` (as JSON) becomes a
  ``failed`` event saying so, instead of a giant database row;
* a streamed output larger than ``max_stream_chunk_bytes`` ends the call the
  same way (the control plane answers 409 to what follows, which stops it);
* an error message is cut to ``max_error_bytes`` with a marker;
* any occurrence of a secret's value given to the replica (``StartReplica.secrets``)
  in the output or error is replaced by ``[redacted:NAME]``.

Pure functions: no I/O, no clock.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from control_plane.protocol import CallEvent

TRUNCATED_MARKER = "…[truncated by thaw: {dropped} more bytes]"


@dataclass(frozen=True)
class CallLimits:
    """Caps on what one call reports (Settings: THAW_MAX_RESULT_BYTES and friends)."""

    max_result_bytes: int = 4 << 20
    max_stream_chunk_bytes: int = 1 << 20
    max_error_bytes: int = 64 << 10
    max_log_bytes_per_call: int = 1 << 20  # what one call may print (worker.log_guard)


def redact(value: Any, secrets: Mapping[str, str]) -> Any:
    """``value`` with every secret's value replaced by ``[redacted:NAME]``, in every
    string it holds (dict keys too). Longer values first, so one that contains
    another is hidden whole."""
    if not secrets:
        return value
    ordered = sorted(((v, k) for k, v in secrets.items() if v), key=lambda p: -len(p[0]))
    return _redact(value, ordered)


def _redact(value: Any, ordered: list[tuple[str, str]]) -> Any:
    if isinstance(value, str):
        for secret, name in ordered:
            value = value.replace(secret, f"[redacted:{name}]")
        return value
    if isinstance(value, list):
        return [_redact(v, ordered) for v in value]
    if isinstance(value, dict):
        return {_redact(k, ordered): _redact(v, ordered) for k, v in value.items()}
    return value


def cap_text(text: str, max_bytes: int) -> str:
    """``text`` cut to at most ``max_bytes`` UTF-8 bytes plus a marker saying how much went."""
    raw = text.encode()
    if len(raw) <= max_bytes:
        return text
    kept = raw[:max_bytes].decode(errors="ignore")
    return kept + TRUNCATED_MARKER.format(dropped=len(raw) - len(kept.encode()))


def guard(event: CallEvent, limits: CallLimits, secrets: Mapping[str, str]) -> CallEvent:
    """The event to report in place of ``event``: redacted, and failed when too large
    (an output event of several chunks: when any one is)."""
    output = redact(event.output, secrets)
    outputs = None if event.outputs is None else [redact(c, secrets) for c in event.outputs]
    error = cap_text(redact(event.error, secrets), limits.max_error_bytes) if event.error else None
    update: dict[str, Any] = {"output": output, "outputs": outputs, "error": error}
    cap = _cap_for(event.kind, limits)
    for chunk in outputs if outputs is not None else [output]:
        if cap is None or chunk is None:
            continue
        size_bytes = json_size(chunk)
        if size_bytes > cap[0]:
            error = _too_large(size_bytes, cap)
            update = {"kind": "failed", "output": None, "outputs": None, "error": error}
            break
    return event.model_copy(update=update)


def json_size(value: Any) -> int:
    """Bytes of ``value`` as compact JSON."""
    return len(json.dumps(value, separators=(",", ":")).encode())


def output_groups(chunks: list[Any], max_bytes: int) -> list[list[Any]]:
    """``chunks`` in order, in groups of at most ``max_bytes`` of JSON each (a chunk
    over it alone in its group, for ``guard`` to refuse): one output event per group
    keeps every event under the control plane's body cap."""
    groups: list[list[Any]] = []
    size = 0
    for chunk in chunks:
        n = json_size(chunk)
        if not groups or size + n > max_bytes:
            groups.append([])
            size = 0
        groups[-1].append(chunk)
        size += n
    return groups


def refused_as_too_large(event: CallEvent) -> CallEvent:
    """The failure to report when the control plane refused ``event`` with 413."""
    what = "result" if event.kind == "succeeded" else "streamed output"
    error = (
        f"the control plane refused this call's {what} as larger than its request body cap "
        "(THAW_MAX_BODY_BYTES); set THAW_MAX_RESULT_BYTES and THAW_MAX_STREAM_CHUNK_BYTES on "
        "the workers below it, and return large outputs by reference"
    )
    return event.model_copy(
        update={"kind": "failed", "output": None, "outputs": None, "error": error}
    )


def _cap_for(kind: str, limits: CallLimits) -> tuple[int, str, str] | None:
    if kind == "succeeded":
        return limits.max_result_bytes, "result", "THAW_MAX_RESULT_BYTES"
    if kind == "output":
        return limits.max_stream_chunk_bytes, "streamed output", "THAW_MAX_STREAM_CHUNK_BYTES"
    return None


def _too_large(size_bytes: int, cap: tuple[int, str, str]) -> str:
    limit_bytes, what, setting = cap
    return (
        f"the function's {what} is {size_bytes} bytes as JSON, over the worker's cap of "
        f"{limit_bytes} bytes ({setting}); return large outputs by reference (write them "
        "to object storage and return the URL) or stream them in smaller pieces"
    )
