"""Which ready replica takes a call. A pure function.

Ready replicas of the function's active version with room (outstanding <
``max_outstanding``); among them one that already holds the call's adapter,
then the fewest outstanding calls, then the id (deterministic). ``None``
means "no replica can take it now": the call stays queued and the activator
and autoscaler bring one up.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ReplicaView:
    id: str
    state: str
    version: int
    outstanding: int
    adapters: frozenset[str] = frozenset()


@dataclass(frozen=True)
class CallRoute:
    version: int
    adapter: str | None
    max_outstanding: int


def choose(replicas: Sequence[ReplicaView], call: CallRoute) -> ReplicaView | None:
    """The replica for ``call``, or None when none is ready with room."""
    ready = [
        r
        for r in replicas
        if r.state == "ready" and r.version == call.version and r.outstanding < call.max_outstanding
    ]
    if not ready:
        return None

    def key(r: ReplicaView) -> tuple[bool, int, str]:
        has_adapter = call.adapter is None or call.adapter in r.adapters
        return (not has_adapter, r.outstanding, r.id)

    return min(ready, key=key)
