"""Reading a streamed call's reports whatever events carried its chunks: the worker
sends the chunks made while it reported the last in one output event (``outputs``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def _get(item: Any, name: str) -> Any:
    return item[name] if isinstance(item, dict) else getattr(item, name)


def streamed(items: Sequence[Any]) -> tuple[list[str], list[Any]]:
    """The kinds of ``items`` (events as dicts, or ``CallUpdate``s) with each run of
    output ones as one ``"output"``, and every streamed chunk in order."""
    kinds: list[str] = []
    chunks: list[Any] = []
    for item in items:
        kind = _get(item, "kind")
        if kind == "output":
            several = _get(item, "outputs")
            chunks += several if several is not None else [_get(item, "output")]
            if kinds and kinds[-1] == "output":
                continue
        kinds.append(kind)
    return kinds, chunks


def seqs(events: Sequence[dict[str, Any]]) -> list[int]:
    """The place of every chunk of the output events, from each event's ``seq``."""
    out: list[int] = []
    for e in events:
        if e["kind"] == "output":
            out += [e["seq"] + n for n in range(len(e["outputs"] or [None]))]
    return out
