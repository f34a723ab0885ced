"""A worker's reported inventory beyond the v1 columns: what each tier holds,
measured bandwidths, pool idle/busy. Stored as one JSON text column
(``workers.inventory_json``); decoded into the scheduler's dataclasses.

Stored shape (every key optional; a missing bandwidth means "use the default")::

    {"holdings": [{"tier": "ram", "digest": "blake3:…", "bytes": 123}, …],
     "bandwidths": {"ram_bytes_per_s": 5e9, "disk_bytes_per_s": null, …},
     "pool_idle": 2, "pool_busy": 1, "gpu_utilization_pct": [37.0, 0.0],
     "engines": {"<replica id>": {"running": 3, "waiting": 0, "kv_cache_usage": 0.2,
                                  "peak_running": 8}, …}}   # LLM replicas' engines
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from control_plane.protocol import EngineStats, WorkerHeartbeat
from control_plane.services.scheduler import DEFAULT_BANDWIDTHS, Bandwidths, Holding


@dataclass(frozen=True)
class WorkerInventory:
    holdings: tuple[Holding, ...] = ()
    bandwidths: Bandwidths = DEFAULT_BANDWIDTHS
    pool_idle: int | None = None
    pool_busy: int | None = None
    gpu_utilization_pct: tuple[float, ...] | None = None
    engines: tuple[tuple[str, EngineStats], ...] = ()  # (replica id, its engine's load)


def encode(msg: WorkerHeartbeat) -> str:
    """The JSON to store for a heartbeat's optional inventory fields."""
    return json.dumps(
        {
            "holdings": [h.model_dump() for h in msg.holdings],
            "bandwidths": msg.bandwidths.model_dump(),
            "pool_idle": msg.pool_idle,
            "pool_busy": msg.pool_busy,
            "gpu_utilization_pct": msg.gpu_utilization_pct,
            "engines": {r.replica_id: r.llm.model_dump() for r in msg.replicas if r.llm},
        }
    )


def _bandwidths(raw: dict[str, Any]) -> Bandwidths:
    d = DEFAULT_BANDWIDTHS
    return Bandwidths(
        ram_bytes_per_s=float(raw.get("ram_bytes_per_s") or d.ram_bytes_per_s),
        disk_bytes_per_s=float(raw.get("disk_bytes_per_s") or d.disk_bytes_per_s),
        store_bytes_per_s=float(raw.get("store_bytes_per_s") or d.store_bytes_per_s),
    )


def decode(text: str) -> WorkerInventory:
    """The stored inventory; ``"{}"`` (a worker that never reported one) gives defaults."""
    raw = json.loads(text or "{}")
    holdings = tuple(
        Holding(str(h["tier"]), str(h["digest"]), int(h["bytes"])) for h in raw.get("holdings", [])
    )
    return WorkerInventory(
        holdings=holdings,
        bandwidths=_bandwidths(raw.get("bandwidths") or {}),
        pool_idle=raw.get("pool_idle"),
        pool_busy=raw.get("pool_busy"),
        gpu_utilization_pct=_utilization(raw.get("gpu_utilization_pct")),
        engines=tuple(
            (rid, EngineStats.model_validate(s)) for rid, s in (raw.get("engines") or {}).items()
        ),
    )


def _utilization(raw: Any) -> tuple[float, ...] | None:
    return None if raw is None else tuple(float(pct) for pct in raw)
