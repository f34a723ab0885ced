"""Which ready replica takes a call. Pure functions, no I/O.

A replica can take a call when it is ready, of the function's active
version, and has room (outstanding < ``max_outstanding``). Among those, in
order:

1. **session**: the replica that served the call's session last
   (``X-Thaw-Session``), while it can take the call and is under the
   affinity bound, so a model's KV or prefix cache is reused;
2. **prefix**: when the function declares its prompt field, the first
   replica in the prompt prefix's rendezvous order (over the ready replicas)
   that can take the call and is under the affinity bound: consistent
   hashing with bounded loads, so a hot prefix spills to its second replica,
   not to a random one;
3. **least outstanding** (the default): one that already holds the call's
   adapter, then the fewest outstanding calls, then the id (deterministic).

The affinity bound is the larger of the load bound,
``ceil(LOAD_BOUND_FACTOR * (outstanding of all ready replicas + 1) / ready
replicas)``, and half the replica's capacity: under heavy load an affinity
never piles calls on one replica while others have room, and under light
load a session or prefix does not move (losing its cache) for one call in
flight. ``None`` means "no replica can take it now": the call stays queued
and the activator and autoscaler bring one up.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

#: How far above the mean load an affinity may push one replica.
LOAD_BOUND_FACTOR = 1.25
#: The share of a replica's capacity an affinity may always fill.
AFFINITY_FLOOR_SHARE = 0.5

Policy = Literal["session", "prefix", "least_outstanding"]


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
    session_replica: str | None = None  # the replica that served this call's session last
    prefix_key: str | None = None  # the prompt's prefix, for functions that route by it


@dataclass(frozen=True)
class Route:
    replica: ReplicaView
    policy: Policy
    rank: int = 0  # prefix: the replica's place in the prefix's order (0: its first)


def prefix_key(call_input: Any, prompt_field: str, prefix_chars: int) -> str | None:
    """The first ``prefix_chars`` characters of the input's prompt, or None.

    The prompt is ``call_input[prompt_field]``: a string as is, anything else
    (chat messages) as compact JSON. None when the input has no such field.
    """
    if not isinstance(call_input, dict) or call_input.get(prompt_field) is None:
        return None
    prompt = call_input[prompt_field]
    text = prompt if isinstance(prompt, str) else json.dumps(prompt, separators=(",", ":"))
    return text[: max(1, prefix_chars)] or None


def rendezvous_score(key: str, replica_id: str) -> int:
    """Highest random weight of ``replica_id`` for ``key``; stable across processes."""
    digest = hashlib.blake2b(f"{key}\0{replica_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rendezvous_order(key: str, replica_ids: Sequence[str]) -> list[str]:
    """``replica_ids`` ranked for ``key``: removing one replica moves only its keys."""
    return sorted(replica_ids, key=lambda rid: (-rendezvous_score(key, rid), rid))


def load_bound(outstanding: Sequence[int], factor: float = LOAD_BOUND_FACTOR) -> int:
    """Outstanding calls at which an affinity stops sending to a replica (>= 1)."""
    if not outstanding:
        return 1
    return max(1, math.ceil(factor * (sum(outstanding) + 1) / len(outstanding)))


def affinity_bound(outstanding: Sequence[int], max_outstanding: int) -> int:
    """Outstanding calls at which a session or prefix stops sending to a replica."""
    floor = math.ceil(AFFINITY_FLOOR_SHARE * max_outstanding)
    return max(load_bound(outstanding), floor)


def _serving(replicas: Sequence[ReplicaView], version: int) -> list[ReplicaView]:
    return [r for r in replicas if r.state == "ready" and r.version == version]


def least_outstanding(ready: Sequence[ReplicaView], adapter: str | None) -> ReplicaView | None:
    """The holder of ``adapter`` with the fewest outstanding calls, else any; by id on ties."""

    def key(r: ReplicaView) -> tuple[bool, int, str]:
        has_adapter = adapter is None or adapter in r.adapters
        return (not has_adapter, r.outstanding, r.id)

    return min(ready, key=key, default=None)


def route(replicas: Sequence[ReplicaView], call: CallRoute) -> Route | None:
    """The replica for ``call`` and the policy that chose it, or None when none has room."""
    serving = _serving(replicas, call.version)
    with_room = [r for r in serving if r.outstanding < call.max_outstanding]
    if not with_room:
        return None
    bound = affinity_bound([r.outstanding for r in serving], call.max_outstanding)
    under_bound = {r.id: r for r in with_room if r.outstanding < bound}
    if call.session_replica in under_bound:
        return Route(under_bound[call.session_replica], "session")
    if call.prefix_key is not None:
        order = rendezvous_order(call.prefix_key, [r.id for r in serving])
        for rank, rid in enumerate(order):
            if rid in under_bound:
                return Route(under_bound[rid], "prefix", rank)
    chosen = least_outstanding(with_room, call.adapter)
    assert chosen is not None  # with_room is not empty
    return Route(chosen, "least_outstanding")


def choose(replicas: Sequence[ReplicaView], call: CallRoute) -> ReplicaView | None:
    """The replica for ``call``, or None when none is ready with room."""
    chosen = route(replicas, call)
    return chosen.replica if chosen is not None else None
