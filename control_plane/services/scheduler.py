"""Placement: which worker should start a replica. A pure function of dataclasses.

``place`` keeps the healthy workers that can run the requested device and
have room, then prefers the one that already holds the model's bytes in its
cache (the cold start skips the store), then the least loaded one. The
cold-start optimizer will refine the preference with per-tier bandwidths;
the signature stays.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from control_plane.errors import NoCapacityError


@dataclass(frozen=True)
class ReplicaRequest:
    function: str
    device: str  # "cpu" | "cuda" | "any"
    model_digest: str | None = None
    memory_bytes: int = 0  # the weights' raw size; 0 when there is no model


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


@dataclass(frozen=True)
class Placement:
    worker_id: str
    device: str  # "cpu" | "cuda", resolved from "any"
    model_cached: bool


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


def place(request: ReplicaRequest, workers: Sequence[WorkerSnapshot]) -> Placement:
    """The best worker for ``request``. Raises ``NoCapacityError`` saying why none fits."""
    candidates = []
    for w in workers:
        device = resolve_device(request.device, w.device_kinds)
        if device is None or not _has_room(w, request):
            continue
        cached = request.model_digest is not None and request.model_digest in w.cached_manifests
        # Sort key: cached first, then fewer replicas, fewer outstanding calls, id.
        candidates.append(((not cached, w.replicas, w.outstanding_calls, w.id), w.id, device))
    if not candidates:
        raise NoCapacityError(_why_none(request, workers))
    candidates.sort()
    key, worker_id, device = candidates[0]
    return Placement(worker_id=worker_id, device=device, model_cached=not key[0])


def _why_none(request: ReplicaRequest, workers: Sequence[WorkerSnapshot]) -> str:
    if not workers:
        return "no worker is registered; start one with `thaw worker` (or `thaw up`)"
    if not any(w.healthy for w in workers):
        return "no healthy worker; check `thaw worker` logs"
    if request.device == "cuda" and not any("cuda" in w.device_kinds for w in workers):
        return f"function {request.function} needs a CUDA device and no worker has one"
    return f"every worker is full for function {request.function}; add workers or capacity"
