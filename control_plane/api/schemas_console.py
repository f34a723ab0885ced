"""Bodies of the endpoints the web console needs beyond the core API:
function stats, workers, the catalog with sharing, uploads, warm-ups."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from control_plane.protocol import MAX_INT32
from control_plane.services.catalog_usage import ArtifactUsage
from control_plane.services.fleet import WorkerInfo
from control_plane.services.llm_stats import LLMStats
from control_plane.services.stats import FunctionStats, LatencySummary
from control_plane.services.uploads import UploadResult


class LatencyPublic(BaseModel):
    count: int
    p50_ms: float | None
    p95_ms: float | None
    p90_ms: float | None = None
    p99_ms: float | None = None

    @classmethod
    def of(cls, s: LatencySummary) -> LatencyPublic:
        return cls.model_validate(s, from_attributes=True)


class FunctionStatsPublic(BaseModel):
    name: str
    version: int | None
    status: str
    replicas: dict[str, int]
    calls: int
    calls_failed: int
    cold_start_rate: float | None
    warm: LatencyPublic
    cold: LatencyPublic
    phase_medians_ms: dict[str, float] = {}

    @classmethod
    def of(cls, s: FunctionStats) -> FunctionStatsPublic:
        return cls(
            name=s.name,
            version=s.version,
            status=s.status,
            replicas=s.replicas,
            calls=s.calls,
            calls_failed=s.calls_failed,
            cold_start_rate=s.cold_start_rate,
            warm=LatencyPublic.of(s.warm),
            cold=LatencyPublic.of(s.cold),
            phase_medians_ms=s.phase_medians_ms,
        )


class ColdWarmPublic(BaseModel):
    cold: LatencyPublic
    warm: LatencyPublic


class TokenRatePublic(BaseModel):
    count: int
    p50: float | None
    p99: float | None
    overall: float | None = Field(description="the window's completion tokens a second")


class TokenCallPublic(BaseModel):
    accepted_at: float
    cold: bool
    prompt_tokens: int
    completion_tokens: int
    ttft_ms: float | None = Field(description="accepted to the first token")
    tpot_ms: float | None = Field(description="mean time per output token after the first")
    generation_ms: float | None
    tokens_per_s: float | None


class LLMStatsPublic(BaseModel):
    """An LLM function's token figures (``services.llm_stats``)."""

    name: str
    calls: int
    prompt_tokens: int
    completion_tokens: int
    ttft: ColdWarmPublic
    tpot: ColdWarmPublic
    tokens_per_s: TokenRatePublic
    points: list[TokenCallPublic] = Field(description="each call's figures, newest first")

    @classmethod
    def of(cls, s: LLMStats) -> LLMStatsPublic:
        return cls.model_validate(s, from_attributes=True)


class ReplicaPublic(BaseModel):
    id: str
    function: str
    version: int
    state: str
    device: str


class CachedArtifactPublic(BaseModel):
    digest: str
    refs: list[str]


class CacheTierPublic(BaseModel):
    tier: str
    bytes: int
    artifacts: list[CachedArtifactPublic]


class WorkerPublic(BaseModel):
    id: str
    name: str
    devices: list[dict[str, Any]]
    memory_bytes: int
    free_memory_bytes: int
    pool_size: int
    cache: list[CacheTierPublic]
    replicas: list[ReplicaPublic]
    healthy: bool
    lost: bool
    last_heartbeat_at: float

    @classmethod
    def of(cls, w: WorkerInfo) -> WorkerPublic:
        return cls.model_validate(w, from_attributes=True)


class ArtifactUsagePublic(BaseModel):
    name: str
    tag: str
    kind: str
    digest: str
    files: int
    raw_size_bytes: int
    stored_size_bytes: int
    shared_stored_bytes: int
    used_by: list[str]

    @classmethod
    def of(cls, a: ArtifactUsage) -> ArtifactUsagePublic:
        return cls.model_validate(a, from_attributes=True)


class UploadPublic(BaseModel):
    ref: str
    digest: str
    kind: str
    files: int
    raw_size_bytes: int
    stored_size_bytes: int
    new_bytes: int
    dedup_bytes: int
    spec: dict[str, Any] | None = None

    @classmethod
    def of(cls, u: UploadResult) -> UploadPublic:
        p = u.push
        return cls(
            ref=p.ref,
            digest=p.digest,
            kind=p.kind.value,
            files=p.files,
            raw_size_bytes=p.raw_size_bytes,
            stored_size_bytes=p.stored_size_bytes,
            new_bytes=p.new_bytes,
            dedup_bytes=p.dedup_bytes,
            spec=u.spec,
        )


class WarmRequest(BaseModel):
    replicas: int = Field(default=1, ge=1, le=MAX_INT32, description="live replicas wanted")


class WarmPublic(BaseModel):
    function: str
    started_replica_id: str | None
    started_replica_ids: list[str] = []
    live_replicas: int
    requested_replicas: int = 1
