"""HTTP shapes of canary versions (``services.canary``)."""

from __future__ import annotations

from pydantic import BaseModel

from control_plane.services.canary import CanaryStatus, VersionStats
from control_plane.services.stats import LatencySummary


class LatencyPublic(BaseModel):
    count: int
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None

    @classmethod
    def of(cls, s: LatencySummary) -> LatencyPublic:
        return cls(count=s.count, p50_ms=s.p50_ms, p95_ms=s.p95_ms, p99_ms=s.p99_ms)


class VersionStatsPublic(BaseModel):
    version: int
    calls: int
    error_rate: float | None
    cold_start_rate: float | None
    latency: LatencyPublic
    first_output: LatencyPublic

    @classmethod
    def of(cls, v: VersionStats) -> VersionStatsPublic:
        return cls(
            version=v.version,
            calls=v.calls,
            error_rate=v.error_rate,
            cold_start_rate=v.cold_start_rate,
            latency=LatencyPublic.of(v.latency),
            first_output=LatencyPublic.of(v.first_output),
        )


class CanaryStatusPublic(BaseModel):
    """Old (active) and new (canary) side by side, over calls accepted since ``started_at``."""

    function: str
    weight_pct: float
    started_at: float
    active: VersionStatsPublic
    canary: VersionStatsPublic

    @classmethod
    def of(cls, s: CanaryStatus) -> CanaryStatusPublic:
        return cls(
            function=s.function,
            weight_pct=s.weight_pct,
            started_at=s.started_at,
            active=VersionStatsPublic.of(s.active),
            canary=VersionStatsPublic.of(s.canary),
        )
