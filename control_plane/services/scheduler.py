"""Placement: which worker should start a replica. A pure function of dataclasses.

``place`` keeps the healthy workers that can run the requested device and
have room, estimates for each how soon the replica would start, and picks
the soonest (ties: fewer replicas, fewer outstanding calls, then the id)::

    estimated_start_s = Σ_tier bytes_from(tier) / bandwidth(tier) + load_penalty_s

Bytes come from the fastest tier that holds them. The tiers are treated as
nested (what is on the device is also in RAM, what is in RAM also on disk),
so a tier serves only what the faster tiers do not already hold::

    device  min(need, held_device)                 free (already in place)
    ram     min(need, held_ram)  - device bytes    ram_bytes_per_s
    disk    min(need, held_disk) - max(above)      disk_bytes_per_s
    store   need - max(held_device, ram, disk)     store_bytes_per_s

``need`` is the model's raw size (or, when unknown, the most any tier holds).
A manifest listed in ``cached_manifests`` (complete in the disk cache, the
v1 heartbeat) counts as fully held on disk. Bandwidths a worker has not
measured yet default to :data:`DEFAULT_BANDWIDTHS`.

The load penalty charges what competes with the start: replicas already
starting (they share the disk and the network), outstanding calls and live
replicas (they share the device and the CPU).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from control_plane.errors import NoCapacityError

TIERS = ("device", "ram", "disk", "store")


@dataclass(frozen=True)
class Bandwidths:
    """Read bandwidth per tier, bytes/s."""

    ram_bytes_per_s: float = 5e9
    disk_bytes_per_s: float = 1e9
    store_bytes_per_s: float = 200e6


DEFAULT_BANDWIDTHS = Bandwidths()
STARTING_REPLICA_PENALTY_S = 2.0
OUTSTANDING_CALL_PENALTY_S = 0.5
REPLICA_PENALTY_S = 0.1


@dataclass(frozen=True)
class ReplicaRequest:
    function: str
    device: str  # "cpu" | "cuda" | "any"
    model_digest: str | None = None
    memory_bytes: int = 0  # the weights' raw size; 0 when there is no model


@dataclass(frozen=True)
class Holding:
    """``bytes`` of manifest ``digest`` held in ``tier`` ("device" | "ram" | "disk")."""

    tier: str
    digest: str
    bytes: int


@dataclass(frozen=True)
class WorkerSnapshot:
    id: str
    healthy: bool
    device_kinds: frozenset[str]
    free_memory_bytes: int
    replicas: int
    max_replicas: int
    outstanding_calls: int = 0
    cached_manifests: frozenset[str] = frozenset()
    starting_replicas: int = 0
    holdings: tuple[Holding, ...] = ()
    bandwidths: Bandwidths = field(default_factory=Bandwidths)


@dataclass(frozen=True)
class Placement:
    worker_id: str
    device: str  # "cpu" | "cuda", resolved from "any"
    model_cached: bool  # no byte has to come from the store
    estimated_start_s: float = 0.0
    source_tier: str = "device"  # the slowest tier that serves any bytes
    bytes_by_tier: tuple[tuple[str, int], ...] = ()


def resolve_device(requested: str, device_kinds: frozenset[str]) -> str | None:
    """The device a worker would use for a request, or None when it cannot serve it."""
    if requested == "any":
        return "cuda" if "cuda" in device_kinds else "cpu"
    if requested == "cpu":
        return "cpu"
    return "cuda" if "cuda" in device_kinds else None


def _has_room(w: WorkerSnapshot, request: ReplicaRequest) -> bool:
    # free_memory_bytes == 0 means "not reported": do not refuse on it.
    memory_ok = w.free_memory_bytes == 0 or w.free_memory_bytes >= request.memory_bytes
    return w.healthy and w.replicas < w.max_replicas and memory_ok


def bytes_by_tier(request: ReplicaRequest, w: WorkerSnapshot) -> dict[str, int]:
    """How many of the model's bytes each tier would serve on ``w`` (see module doc)."""
    digest = request.model_digest
    if digest is None:
        return {t: 0 for t in TIERS}
    held = {"device": 0, "ram": 0, "disk": 0}
    for h in w.holdings:
        if h.digest == digest and h.tier in held:
            held[h.tier] = max(held[h.tier], h.bytes)
    need = request.memory_bytes or max(held.values())
    if digest in w.cached_manifests:
        held["disk"] = need
    device = min(need, held["device"])
    ram = max(0, min(need, held["ram"]) - device)
    disk = max(0, min(need, held["disk"]) - device - ram)
    return {"device": device, "ram": ram, "disk": disk, "store": need - device - ram - disk}


def load_penalty_s(w: WorkerSnapshot) -> float:
    return (
        w.starting_replicas * STARTING_REPLICA_PENALTY_S
        + w.outstanding_calls * OUTSTANDING_CALL_PENALTY_S
        + w.replicas * REPLICA_PENALTY_S
    )


def estimated_start_s(request: ReplicaRequest, w: WorkerSnapshot) -> float:
    """Seconds until a replica of ``request`` would be ready on ``w`` (an estimate)."""
    by_tier = bytes_by_tier(request, w)
    bw = w.bandwidths
    load_s = (
        by_tier["ram"] / bw.ram_bytes_per_s
        + by_tier["disk"] / bw.disk_bytes_per_s
        + by_tier["store"] / bw.store_bytes_per_s
    )
    return load_s + load_penalty_s(w)


def _holds(request: ReplicaRequest, w: WorkerSnapshot) -> bool:
    digest = request.model_digest
    if digest is None:
        return False
    held = any(h.digest == digest and h.bytes > 0 for h in w.holdings)
    return held or digest in w.cached_manifests


def _source_tier(by_tier: dict[str, int]) -> str:
    used = [t for t in TIERS if by_tier[t] > 0]
    return used[-1] if used else "device"


def place(request: ReplicaRequest, workers: Sequence[WorkerSnapshot]) -> Placement:
    """The worker where ``request`` starts soonest.

    Raises ``NoCapacityError`` saying why no worker fits.
    """
    best: tuple[tuple[float, int, int, str], Placement] | None = None
    for w in workers:
        device = resolve_device(request.device, w.device_kinds)
        if device is None or not _has_room(w, request):
            continue
        by_tier = bytes_by_tier(request, w)
        estimate_s = estimated_start_s(request, w)
        key = (estimate_s, w.replicas, w.outstanding_calls, w.id)
        if best is None or key < best[0]:
            placement = Placement(
                worker_id=w.id,
                device=device,
                model_cached=_holds(request, w) and by_tier["store"] == 0,
                estimated_start_s=estimate_s,
                source_tier=_source_tier(by_tier),
                bytes_by_tier=tuple(by_tier.items()),
            )
            best = (key, placement)
    if best is None:
        raise NoCapacityError(_why_none(request, workers))
    return best[1]


def _why_none(request: ReplicaRequest, workers: Sequence[WorkerSnapshot]) -> str:
    if not workers:
        return "no worker is registered; start one with `thaw worker` (or `thaw up`)"
    if not any(w.healthy for w in workers):
        return "no healthy worker; check `thaw worker` logs"
    if request.device == "cuda" and not any("cuda" in w.device_kinds for w in workers):
        return f"function {request.function} needs a CUDA device and no worker has one"
    return f"every worker is full for function {request.function}; add workers or capacity"
