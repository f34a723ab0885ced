"""The boundary between the control plane and a worker agent (version 1).

Both sides import these models; nothing else crosses the boundary. Every
payload carries ``v`` (:data:`PROTOCOL_VERSION`); a receiver refuses a
payload whose major version it does not know (:func:`check_version`).

Celery, control plane → worker (JSON only; one queue per worker, named by
:func:`worker_queue`; ``task_acks_late``, ``task_reject_on_worker_lost``,
``worker_prefetch_multiplier=1``)::

    thaw.start_replica   StartReplica   start (specialize) a replica
    thaw.stop_replica    StopReplica    drain and stop a replica
    thaw.run_call        RunCall        run one call; the task blocks until it ends

Each task takes one positional argument: the model's ``model_dump(mode="json")``.

HTTP, worker → control plane (``Authorization: Bearer <key>``, scope
``worker`` or ``admin``)::

    POST /v1/workers/register          WorkerRegister  → WorkerRegistered
    POST /v1/workers/{id}/heartbeat    WorkerHeartbeat → HeartbeatReply
    POST /v1/replicas/{id}/events      ReplicaEvent    → 200
    POST /v1/calls/{id}/events         CallEvent       → 200, or 409 when the
                                                         call is already final
                                                         (stop sending for it)

Replica life, as the worker reports it::

    starting ──▶ ready ──▶ stopped
        └──────▶ failed

Call life, as the worker reports it (one attempt)::

    started ──▶ output* ──▶ succeeded | failed | timeout | cancelled

(``started`` is left out when the ``RunCall`` says ``report_started: false``.)
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

PROTOCOL_VERSION = 1

TASK_START_REPLICA = "thaw.start_replica"
TASK_STOP_REPLICA = "thaw.stop_replica"
TASK_RUN_CALL = "thaw.run_call"

#: Cold-start phases, in the order they happen.
REPLICA_PHASES = (
    "schedule",
    "transit",
    "pool_acquire",
    "process_start",
    "imports",
    "device_init",
    "weights_fetch",
    "weights_to_device",
    "adapters",
    "user_setup",
    "first_output",
)

MAX_INT64 = 2**63 - 1
MAX_INT32 = 2**31 - 1
#: Sizes and counts fit the database's integer columns; times are finite.
Bytes = Annotated[int, Field(ge=0, le=MAX_INT64)]
Count = Annotated[int, Field(ge=0, le=MAX_INT32)]
Attempt = Annotated[int, Field(ge=1, le=MAX_INT32)]
Millis = Annotated[float, Field(allow_inf_nan=False)]

Device = Literal["cpu", "cuda"]
ReplicaState = Literal["starting", "ready", "draining", "failed", "stopped"]
CallEventKind = Literal["started", "output", "succeeded", "failed", "timeout", "cancelled"]
Fault = Literal["function", "replica"]
FINAL_CALL_EVENTS: frozenset[str] = frozenset({"succeeded", "failed", "timeout", "cancelled"})


class ProtocolVersionError(ValueError):
    """A payload of a protocol major version this side does not speak."""


def worker_queue(worker_id: str) -> str:
    """The Celery queue a worker consumes."""
    return f"thaw.worker.{worker_id}"


def check_version(v: int) -> None:
    """Refuse a payload from an incompatible peer, saying which side to upgrade."""
    if v != PROTOCOL_VERSION:
        raise ProtocolVersionError(
            f"protocol version {v} is not supported (this side speaks {PROTOCOL_VERSION}); "
            "run the same thaw version on the control plane and the workers"
        )


class Message(BaseModel):
    """Base of every payload: versioned, unknown fields ignored (additive changes)."""

    model_config = ConfigDict(extra="ignore")

    v: int = PROTOCOL_VERSION

    @field_validator("v")
    @classmethod
    def _known_version(cls, v: int) -> int:
        check_version(v)
        return v


# --- Celery: control plane → worker ------------------------------------------


class AdapterSpec(BaseModel):
    name: str
    digest: str


class ContainerOptions(BaseModel):
    """Set for ``runtime = "docker"`` functions: the worker's Docker runtime runs the replica."""

    image: str
    network: bool = False
    memory_bytes: int | None = None
    cpus: float | None = None


#: Stop strings of one LLM call, on every route: each token is scanned for each of
#: them in the engine's router thread, which every stream of the replica waits on.
MAX_STOP_SEQUENCES = 4
MAX_STOP_CHARS = 1024


class LLMOptions(BaseModel):
    """How an LLM function's replica serves its model (``[llm]`` in ``thaw.toml``;
    ``worker.llm``). Sizes are explicit: the KV cache gets ``kv_cache_mb``, never
    "most of free memory"."""

    model_config = ConfigDict(extra="forbid")

    # "auto": the dtype the weights were pushed in; else they are cast once at start
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    max_num_seqs: int = Field(default=8, ge=1, le=1024)  # sequences in one batch
    max_batch_tokens: int = Field(default=512, ge=16, le=1 << 20)  # tokens one step takes
    kv_cache_mb: int = Field(default=64, ge=1, le=1 << 20)  # the paged KV cache's size
    context_length: int | None = Field(default=None, ge=16, le=1 << 24)  # None: the model's
    max_tokens_limit: int = Field(default=4096, ge=1, le=1 << 24)  # most tokens one call asks
    # On a CPU: a step whose time per generated token (on the replica's own threads)
    # reaches this runs on every core the replica may use (worker.llm.threads); 0: never.
    wide_step_ms_per_token: float = Field(default=3.0, ge=0, le=1e6)
    # On a GPU: each engine step replays a CUDA graph (worker.llm.engine); a model whose
    # forward cannot be captured runs eagerly, as every model does with this off. Off
    # with adapters: a graph keeps the adapter it was captured with.
    cuda_graphs: bool = True
    # v1.12: calls naming different LoRA adapters (or none) run in one batch, each
    # token through its own call's adapter (worker.llm.adapters); off: one adapter at a
    # time, calls for another waiting until the running ones end.
    mixed_adapters: bool = True
    # v1.13: a prompt's KV blocks already in the cache (the same prefix, through the same
    # adapter load) are reused, not computed again (transformers' block sharing, keyed by
    # adapter: worker.llm.prefix); off: every prompt is prefilled.
    prefix_caching: bool = True


#: The most inter-token gaps one call reports (a longer completion reports its first).
MAX_TOKEN_GAPS = 1 << 16
#: The most streamed chunks one output event carries.
MAX_OUTPUTS_PER_EVENT = 1024


class TokenUsage(BaseModel):
    """An LLM call's tokens, as its replica counted them."""

    prompt_tokens: Count
    completion_tokens: Count


class StartReplica(Message):
    replica_id: str
    function: str
    version: int
    bundle_digest: str
    entry: str = Field(description='"module:ClassName" inside the bundle')
    model_digest: str | None = None
    adapters: list[AdapterSpec] = Field(default_factory=list)
    device: Device = "cpu"
    timeout_s: float = 300.0
    # v1.2, optional: W3C trace context of the call this start is for (tracing).
    traceparent: str | None = Field(default=None, max_length=55)
    env: dict[str, str] = Field(default_factory=dict)
    # The function's secrets (`thaw secrets set`), by name: set in the replica's
    # environment at start, redacted from its call records; never in a bundle or image.
    secrets: dict[str, str] = Field(default_factory=dict, repr=False)
    container: ContainerOptions | None = None
    # Dynamic batching (spec ``[batching]``); None: one call per __call__.
    max_batch_size: int | None = Field(default=None, ge=1, le=1024)
    max_wait_ms: float = Field(default=0.0, ge=0)
    # v1.3, optional: calls the replica runs at once (``target_concurrency``); more
    # wait there for a slot. Control planes count slots, but two of them routing at
    # the same moment may each take the last one. None: no cap.
    max_concurrent_calls: int | None = Field(default=None, ge=1)
    # v1.9, optional: set for an LLM function (its entry is thaw's own, worker.llm).
    llm: LLMOptions | None = None


class StopReplica(Message):
    replica_id: str
    reason: str = ""


class RunCall(Message):
    call_id: str
    attempt: Attempt = 1
    replica_id: str
    function: str
    input: Any = None
    adapter: str | None = None
    stream: bool = False
    timeout_s: float = 300.0
    accepted_at: float = Field(description="unix seconds when the control plane accepted it")
    # v1.2, optional: W3C trace context naming the call's span (control_plane.tracing);
    # the worker continues the trace from it. An older peer ignores or omits it.
    traceparent: str | None = Field(default=None, max_length=55)
    # v1.6, optional: False when the sender waits for the end and has no use for the
    # ``started`` event (a warm call over the direct port): the worker sends none.
    report_started: bool = True


# --- HTTP: worker → control plane ---------------------------------------------


class DeviceInfo(BaseModel):
    kind: str = Field(description='"cpu" or "cuda"')
    name: str = ""
    memory_bytes: Bytes = 0


class WorkerRegister(Message):
    worker_id: str
    name: str = ""
    devices: list[DeviceInfo] = Field(default_factory=list)
    memory_bytes: Bytes = 0
    pool_size: Count = 0
    cached_manifests: list[str] = Field(default_factory=list)
    cache_bytes: Bytes = 0
    # v1.3: the direct call port (worker.dataplane), "host:port", and the token a
    # connection must present; None: the worker takes calls through its queue only.
    data_addr: str | None = Field(default=None, max_length=300)
    data_token: str | None = Field(default=None, max_length=200)
    # v1.8, optional: where the worker's broker and store are, without credentials
    # (``control_plane.fingerprints``); the control plane refuses a worker whose
    # broker or store is not its own. None (an older worker): not compared.
    broker: str | None = Field(default=None, max_length=1000)
    store: str | None = Field(default=None, max_length=1000)


class WorkerRegistered(Message):
    worker_id: str
    queue: str
    heartbeat_interval_s: float


class EngineStats(BaseModel):
    """An LLM replica's engine now (``worker.llm``): what vLLM's gauges report."""

    running: Count = 0  # requests in the running batch
    waiting: Count = 0  # requests in the replica not yet in it (batch slots, KV, adapter)
    kv_cache_usage: float = Field(default=0.0, ge=0, le=1)  # share of KV blocks live requests hold
    peak_running: Count = 0  # the most requests one running batch held since the replica started
    aborted: Count = 0  # requests cancelled before they finished since it started
    # v1.11, optional: on CUDA graphs, since the engine's start probe, graphs captured
    # for step shapes that came again, and steps run eagerly on their shape's first coming.
    graph_captures: Count = 0
    graph_eager_steps: Count = 0
    # v1.13, optional: since it started, prompt tokens looked up in the prefix cache, and
    # of them those found there (not computed again), as vLLM's prefix_cache_queries
    # and prefix_cache_hits count them.
    prefix_cache_queries: Count = 0
    prefix_cache_hits: Count = 0


class ReplicaReport(BaseModel):
    replica_id: str
    state: ReplicaState
    outstanding_calls: Count = 0
    # v1.10, optional: an LLM replica's engine (None: not an LLM replica, or not yet known).
    llm: EngineStats | None = None


Tier = Literal["device", "ram", "disk"]


class TierHolding(BaseModel):
    """How many of a manifest's weight bytes one tier of the worker holds now."""

    tier: Tier
    digest: str
    bytes: Bytes


class TierBandwidths(BaseModel):
    """Measured read bandwidth per tier, bytes/s (``None``: not measured yet; the
    scheduler then assumes its defaults, ``scheduler.DEFAULT_BANDWIDTHS``)."""

    ram_bytes_per_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    disk_bytes_per_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    store_bytes_per_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None


class WorkerHeartbeat(Message):
    """``holdings``, ``bandwidths``, ``pool_idle`` and ``pool_busy`` are optional
    (added in v1.1): an older worker omits them and is placed on defaults."""

    replicas: list[ReplicaReport] = Field(default_factory=list)
    cached_manifests: list[str] = Field(default_factory=list)
    cache_bytes: Bytes = 0
    free_memory_bytes: Bytes = 0
    pool_size: Count = 0
    healthy: bool = True
    # v1.3, optional: why ``healthy`` is false (e.g. the cache disk is full).
    unhealthy_reason: str | None = Field(default=None, max_length=2000)
    holdings: list[TierHolding] = Field(default_factory=list)
    bandwidths: TierBandwidths = Field(default_factory=TierBandwidths)
    pool_idle: Count | None = None
    pool_busy: Count | None = None
    # v1.4, optional: percent busy of each CUDA device (index order), as NVML reports
    # it; None: no GPU, or not measurable. Exported to /metrics, never a scaling signal.
    gpu_utilization_pct: list[Annotated[float, Field(ge=0, le=100)]] | None = Field(
        default=None, max_length=64
    )


class HeartbeatReply(Message):
    cancel_call_ids: list[str] = Field(default_factory=list)
    stop_replica_ids: list[str] = Field(default_factory=list)


class ReplicaEvent(Message):
    state: ReplicaState
    phases_ms: dict[str, Millis] = Field(default_factory=dict)
    error: str | None = None
    # v1.7, failed: "function" when the function's own code failed the start (its
    # import or ``setup``), which says nothing about the worker; None: the replica's.
    fault: Fault | None = None


class CallEvent(Message):
    """``timings_ms`` may carry ``adapter_load`` (ms spent loading the call's
    adapter); ``adapter_hit`` says whether the replica already held it
    (``None``: no adapter, or not reported). A call of a batched function
    carries ``batch_size`` (calls in its batch) and ``batch_index`` (its place
    in it; the control plane counts each batch once, from index 0); its
    ``timings_ms`` has ``batch_wait`` (ms it waited in the replica for the batch)."""

    attempt: Attempt = 1
    kind: CallEventKind
    output: Any = None
    error: str | None = None
    timings_ms: dict[str, Millis] = Field(default_factory=dict)
    adapter_hit: bool | None = None
    # v1.2, final events: every adapter the replica holds after the call (listed
    # ones and those loaded on first use; the router prefers holders); None: not
    # reported (an older worker).
    loaded_adapters: list[Annotated[str, Field(max_length=300)]] | None = Field(
        default=None, max_length=1024
    )
    batch_size: Annotated[int, Field(ge=1, le=MAX_INT32)] | None = None
    batch_index: Count | None = None
    # v1.4, output events: the chunk's 1-based place in its attempt, so a retried
    # post is stored once; None (an older worker): stored after the last one.
    seq: Annotated[int, Field(ge=1, le=MAX_INT32)] | None = None
    # v1.10, output events: several chunks in order (those made while the last event
    # was being reported), the first at ``seq``; ``output`` is then unused.
    outputs: list[Any] | None = Field(default=None, min_length=1, max_length=MAX_OUTPUTS_PER_EVENT)
    # v1.5, failed events: the call never started (its replica was gone when it
    # arrived); the control plane runs it again while retries remain.
    not_run: bool | None = None
    # v1.7, failed events: whose failure it is. "function": the function raised or
    # returned what cannot be sent; it says nothing about the worker. "replica": its
    # replica died or stopped answering during the call; the control plane runs it
    # again while retries remain, and the worker's breaker counts it
    # (``services.worker_health``). None (an older worker): the function's.
    fault: Fault | None = None
    # v1.9, final events of an LLM call: its prompt and completion tokens. Its time to
    # first token and time per output token are in ``timings_ms``.
    usage: TokenUsage | None = None
    # v1.10, final events of an LLM call: each gap between its output tokens, ms, as
    # the replica timed them (the inter-token latency histogram); not stored.
    token_gaps_ms: list[Annotated[float, Field(ge=0, allow_inf_nan=False)]] | None = Field(
        default=None, max_length=MAX_TOKEN_GAPS
    )

    def chunks(self) -> list[Any]:
        """An output event's chunks in order: ``outputs``, else ``output`` alone."""
        return list(self.outputs) if self.outputs is not None else [self.output]
