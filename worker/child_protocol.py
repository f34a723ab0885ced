"""Messages between the worker agent and one replica child process.

They travel as frames (``worker.frames``) over a Unix-domain socket pair
the agent creates; every message has a ``type``. One replica's life::

    child                                   agent
      │ (generic start: python, torch, device context)
      │── hello {pid, device, phases_ms} ────▶│   the process is now poolable
      │◀────────────────── prepare {store} ───│   (pooled only) loader + staging buffers
      │── prepared {phases_ms} ──────────────▶│
      │◀──────────────── specialize {spec} ───│   code, weights, adapters, setup
      │── ready {phases_ms, loads} ──────────▶│   or setup_failed {error, phases_ms}
      │◀───────── call {call_id, input, ..} ──│   any number, concurrently (a batched
      │                                       │   replica gathers them: worker.batcher)
      │── output {call_id, chunk} ───────────▶│   zero or more per call (streaming)
      │── result {call_id, output} ──────────▶│   or error {call_id, error}
      │◀──────────────── cancel {call_id} ────│   its deadline passed: stop that call
      │◀───────────────────── ping {seq} ─────│   (after a cancel) still answering?
      │── pong {seq} ────────────────────────▶│   from the serving thread, at once
      │── engine {stats} ────────────────────▶│   an LLM replica: its engine's load, as
      │                                       │   it changes (worker.engine_report)
      │◀──────────────────────── shutdown ────│   or the agent kills the process
      ▼

The child exits as soon as its socket closes, so it never outlives its
agent. Phases are measured in the child in milliseconds; the agent adds
``pool_acquire`` and reports the sum.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, TypeAdapter

from control_plane.protocol import EngineStats, LLMOptions, TokenUsage


class AdapterRef(BaseModel):
    name: str
    digest: str


class StoreSpec(BaseModel):
    """Where the child reads artifacts (mirrors ``snapshotter.config``)."""

    url: str
    s3_endpoint_url: str | None = None
    s3_region: str | None = None
    s3_access_key_id: str | None = None
    s3_secret_access_key: str | None = None
    cache_dir: str
    cache_max_bytes: int
    bundles_dir: str
    chunk_size_bytes: int = 8 << 20
    loader_max_inflight_bytes: int = 256 << 20
    loader_fetch_threads: int = 16
    loader_decode_threads: int = 4
    loader_lease_ttl_s: float = 0.0  # a load's gc lease in the store (0: none)
    loader_map_cache: bool = True  # map the disk cache's pages into CPU loads, no copy
    ram_tier_dir: str | None = None  # the worker's host-RAM tier; None or max 0: none
    ram_tier_max_bytes: int = 0
    ram_tier_verify: bool = True
    ram_tier_pin_ahead: bool = True  # a CUDA pool process pins the tier while it waits


class ContainerSpec(BaseModel):
    """How the Docker runtime runs a replica (``runtime: docker`` functions only)."""

    image: str  # NAME:TAG pushed with `thaw images push`, or an image digest
    network: bool = False  # no network unless the function allows it
    memory_bytes: int | None = None
    cpus: float | None = None


class ReplicaSpec(BaseModel):
    """Everything a generic child needs to become one function's replica."""

    replica_id: str
    function: str
    version: int = 1
    bundle_digest: str | None = None
    bundle_dir: str | None = None  # a local code directory instead of a bundle (tests, dev)
    entry: str
    model_digest: str | None = None
    adapters: list[AdapterRef] = Field(default_factory=list)
    device: Literal["cpu", "cuda"] = "cpu"
    env: dict[str, str] = Field(default_factory=dict)
    # Which env entries are secrets: redacted from what the replica prints (worker.log_guard).
    secret_names: list[str] = Field(default_factory=list)
    max_log_bytes_per_call: int | None = Field(default=None, ge=1)  # None: no cap
    store: StoreSpec | None = None
    container: ContainerSpec | None = None  # set when the function runs in a container
    adapter_cache_size: int = Field(default=8, ge=0)  # adapters loaded on first use, LRU
    max_batch_size: int | None = Field(default=None, ge=1)  # set: calls go to batch()
    max_wait_ms: float = Field(default=0.0, ge=0)
    max_concurrent_calls: int | None = Field(default=None, ge=1)  # more wait for a slot
    llm: LLMOptions | None = None  # an LLM function: how its replica serves the model
    cpu_threads: int | None = Field(default=None, ge=1)  # torch's on a CPU (None: its own)
    # Every core the replica may use, for an LLM step heavy enough (worker.llm.threads);
    # None: its cpu_threads only (the worker was given a thread count).
    cpu_cores: int | None = Field(default=None, ge=1)


# --- agent → child ---------------------------------------------------------
class Specialize(BaseModel):
    type: Literal["specialize"] = "specialize"
    spec: ReplicaSpec


class CallMsg(BaseModel):
    type: Literal["call"] = "call"
    call_id: str
    attempt: int = 1
    input: Any = None
    adapter: str | None = None
    stream: bool = False  # the caller reads outputs as they come


class Prepare(BaseModel):
    """Sent to a pooled generic process: build the weight loader for ``store`` now
    (store client, disk cache, RAM tier, staging buffers), so ``specialize`` need not."""

    type: Literal["prepare"] = "prepare"
    store: StoreSpec
    # CPU: host memory to populate now for the next start's weights (its worker's
    # guess from its last start); 0: none (``snapshotter.host_arena``).
    host_bytes: int = Field(default=0, ge=0)
    # Library modules to import now: what the worker's last start on this device
    # imported (``worker.preimport``).
    imports: list[str] = Field(default_factory=list)


class Shutdown(BaseModel):
    type: Literal["shutdown"] = "shutdown"


class CancelCall(BaseModel):
    """Stop one call (``worker.call_cancel``); the replica answers it as an ``error``."""

    type: Literal["cancel"] = "cancel"
    call_id: str


class Ping(BaseModel):
    type: Literal["ping"] = "ping"
    seq: int


# --- child → agent ---------------------------------------------------------
class Hello(BaseModel):
    type: Literal["hello"] = "hello"
    pid: int
    device: str
    phases_ms: dict[str, float]


class Prepared(BaseModel):
    type: Literal["prepared"] = "prepared"
    phases_ms: dict[str, float] = Field(default_factory=dict)


class LoadStats(BaseModel):
    """One weights load in the child (from ``snapshotter.LoadReport``): the bytes each
    tier served and how long the load's pipeline ran (wall minus setup)."""

    digest: str
    tensor_bytes: int
    ram_bytes: int = 0
    cache_bytes: int = 0
    store_bytes: int = 0
    cache_hits: int = 0
    store_gets: int = 0
    seconds: float = 0.0
    prefaulted_bytes: int = 0  # buffers carved from memory the pooled process populated
    arena_bytes: int = 0  # populated memory the buffers would need (outside the RAM tier)


class Ready(BaseModel):
    type: Literal["ready"] = "ready"
    phases_ms: dict[str, float]
    loads: list[LoadStats] = Field(default_factory=list)
    # Library modules the start imported (``worker.preimport``): the next pooled
    # process imports them while it waits.
    imports: list[str] = Field(default_factory=list)


class SetupFailed(BaseModel):
    type: Literal["setup_failed"] = "setup_failed"
    error: str
    phases_ms: dict[str, float] = Field(default_factory=dict)


class Pong(BaseModel):
    type: Literal["pong"] = "pong"
    seq: int


class EngineReport(BaseModel):
    """An LLM replica's engine load, sent as it changes (``worker.engine_report``)."""

    type: Literal["engine"] = "engine"
    stats: EngineStats


class Output(BaseModel):
    type: Literal["output"] = "output"
    call_id: str
    chunk: Any = None


class CallEnd(BaseModel):
    """What ``Result`` and ``CallError`` both report about the call that ended."""

    call_id: str
    timings_ms: dict[str, float] = Field(default_factory=dict)
    adapter_hit: bool | None = None  # None: the call named no adapter
    loaded_adapters: list[str] | None = None  # held after a call naming an adapter
    batch_size: int | None = None  # batched functions: calls in this call's batch
    batch_index: int | None = None  # and this call's place in it
    usage: TokenUsage | None = None  # the tokens the function counted (``CallContext.usage``)
    token_gaps_ms: list[float] | None = None  # its inter-token gaps (``CallContext.token_gaps_ms``)


class Result(CallEnd):
    type: Literal["result"] = "result"
    output: Any = None


class CallError(CallEnd):
    type: Literal["error"] = "error"
    error: str
    cancelled: bool = False  # it ended because the agent cancelled it


ToChildMessage = Prepare | Specialize | CallMsg | CancelCall | Ping | Shutdown
FromChildMessage = (
    Hello | Prepared | Ready | SetupFailed | Pong | Output | Result | CallError | EngineReport
)
ToChild = Annotated[ToChildMessage, Field(discriminator="type")]
FromChild = Annotated[FromChildMessage, Field(discriminator="type")]
TO_CHILD: TypeAdapter[ToChildMessage] = TypeAdapter(ToChild)
FROM_CHILD: TypeAdapter[FromChildMessage] = TypeAdapter(FromChild)


def dump(message: BaseModel) -> dict[str, Any]:
    return message.model_dump(mode="json")
