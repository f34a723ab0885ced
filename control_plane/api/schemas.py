"""HTTP request and response bodies, named by role (``KeyCreate``, ``CallPublic``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from control_plane.protocol import TokenUsage
from control_plane.services.calls import CallView
from control_plane.services.catalog import ArtifactInfo
from control_plane.services.functions import FunctionInfo
from control_plane.services.keys import KeyInfo


class KeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    scopes: list[Literal["admin", "deploy", "invoke", "worker"]] = Field(min_length=1)
    name: str = Field(default="", max_length=200)
    function: str | None = Field(default=None, max_length=200)
    rate_per_s: float | None = Field(default=None, gt=0, le=1_000_000, description="invokes/s")
    rate_burst: int | None = Field(default=None, ge=1, le=1_000_000)


class KeyPublic(BaseModel):
    id: str
    name: str
    scopes: list[str]
    function: str | None
    created_at: float
    revoked_at: float | None
    rate_per_s: float | None = None
    rate_burst: int | None = None

    @classmethod
    def of(cls, k: KeyInfo) -> KeyPublic:
        return cls(**k.__dict__)


class KeyCreated(KeyPublic):
    token: str = Field(description="shown once; store it now")


class ModelPublic(BaseModel):
    name: str
    tag: str
    kind: str
    digest: str
    raw_size_bytes: int
    stored_size_bytes: int
    files: int

    @classmethod
    def of(cls, a: ArtifactInfo) -> ModelPublic:
        return cls(**a.__dict__)


class CanaryPublic(BaseModel):
    version: int
    weight_pct: float
    started_at: float


class HealthPublic(BaseModel):
    """``failing``: the active version's latest replica start failed (``last_error``
    says why); ``ok`` once a replica of that version becomes ready."""

    state: Literal["ok", "failing"] = "ok"
    last_error: str | None = None
    last_error_at: float | None = None
    last_error_replica_id: str | None = None


class FunctionPublic(BaseModel):
    name: str
    version: int | None
    versions: list[int]
    spec: dict[str, Any] | None
    model_digest: str | None
    created_at: float
    canary: CanaryPublic | None = None  # GET /v1/functions/{name}/canary compares them
    health: HealthPublic = Field(default_factory=HealthPublic)

    @classmethod
    def of(cls, f: FunctionInfo) -> FunctionPublic:
        canary = None if f.canary is None else CanaryPublic(**f.canary.__dict__)
        health = HealthPublic(**f.health.__dict__)
        return cls(**{**f.__dict__, "canary": canary, "health": health})


class RollbackBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int | None = Field(
        default=None, ge=1, le=2**31 - 1, description="default: the previous version"
    )


class InvokeBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input: Any = None
    adapter: str | None = Field(default=None, max_length=200)


class CallPublic(BaseModel):
    call_id: str
    function: str
    version: int
    status: str
    attempt: int
    output: Any = None
    error: str | None = None
    adapter: str | None = None
    cold: bool
    replica_id: str | None = None  # the replica that ran (or last took) the call
    worker: str | None = None  # the name of that replica's worker
    phases_ms: dict[str, float]
    timings_ms: dict[str, float]
    accepted_at: float
    finished_at: float | None
    usage: TokenUsage | None = None  # an LLM call's tokens; None for any other call

    @classmethod
    def of(cls, c: CallView) -> CallPublic:
        return cls(
            call_id=c.id,
            function=c.function,
            version=c.version,
            status=c.status,
            attempt=c.attempt,
            output=c.output,
            error=c.error,
            adapter=c.adapter,
            cold=c.cold,
            replica_id=c.replica_id,
            worker=c.worker,
            phases_ms=c.phases_ms,
            timings_ms=c.timings_ms,
            accepted_at=c.accepted_at,
            finished_at=c.finished_at,
            usage=c.usage,
        )


class CallAccepted(BaseModel):
    call_id: str
    status: str


class ErrorBody(BaseModel):
    detail: str
