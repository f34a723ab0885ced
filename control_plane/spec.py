"""A function's deployment spec: what ``thaw deploy`` sends and each version stores.

On disk, next to the code, as ``thaw.toml`` (or ``thaw.yaml`` with the same keys)::

    name = "echo"                  # [a-z0-9-], unique per installation
    entry = "app:Echo"             # module:Class inside the code directory
    model = "llama-tiny:v1"        # optional NAME:TAG of a pushed model
    device = "any"                 # cpu | cuda | any
    timeout_s = 60                 # per call, seconds
    retries = 1                    # re-runs when a worker is lost mid-call
    on_disconnect = "cancel"       # a streaming client gone: cancel | finish the call
    runtime = "docker"             # optional: run in a container (default "process")
    image = "myimage:v1"           # pushed with `thaw images push myimage:v1`
    network = false                # containers have no network unless true
    memory_bytes = 4294967296      # optional container limits
    cpus = 2.0                     # (top-level keys come before any [table])
    secrets = ["HF_TOKEN"]         # `thaw secrets set` names: environment variables
                                   # of the replica, set at start, never in the spec

    [[adapters]]                   # optional LoRA adapters, preloaded
    name = "fr"                    # what callers pass as "adapter"
    ref = "llama-fr:v1"            # NAME:TAG of a pushed adapter

    [scaling]
    min_replicas = 0
    max_replicas = 2
    idle_timeout_s = 300
    target_concurrency = 4         # calls in flight per replica before scaling up

    [batching]                     # optional: the replica takes calls as a list
    max_batch_size = 8             # at most this many calls in one batch(...)
    max_wait_ms = 10               # how long the first call of a batch waits for more

    [routing]                      # optional: prefix-aware routing (services.router)
    prompt_field = "prompt"        # the input field holding the prompt
    prefix_chars = 256             # calls sharing this many leading characters
                                   # prefer the same replica (bounded by load)

    [limits]                       # optional: invokes over this rate get 429
    calls_per_s = 5.0              # tokens a second, per control-plane process
    burst = 10                     # calls at once after a quiet spell (default: 1 s worth)

    [env]                          # passed to the replica process
    MY_FLAG = "1"

``thaw deploy DIR`` pushes DIR to the store as a bundle artifact (through the
snapshotter; ``thaw.toml`` included) and sends the spec with ``bundle`` set
to the bundle's manifest digest. The API never receives code itself.

An LLM function has no code of its own: ``[llm]`` instead of ``entry`` serves the
pushed Hugging Face causal LM ``model`` (its tokenizer and chat template from the
model's files) on a continuous-batching engine, behind the OpenAI routes
(``/openai/v1``). ``thaw deploy --llm MODEL NAME`` writes this for you::

    name = "chat"
    model = "qwen-0.5b:v1"

    [llm]                          # all optional (control_plane.protocol.LLMOptions)
    dtype = "auto"                 # auto (as pushed) | float32 | bfloat16 | float16
    max_num_seqs = 8               # sequences in one batch: the replica's concurrency
    max_batch_tokens = 512         # tokens one engine step processes
    kv_cache_mb = 64               # the paged KV cache, sized here, never "free memory"
    context_length = 2048          # default: the model's max_position_embeddings
    max_tokens_limit = 4096        # the most tokens one call may ask for
    wide_step_ms_per_token = 3.0   # CPU: a step this slow per token takes every core
    cuda_graphs = true             # GPU: steps replay CUDA graphs (off with adapters)
    mixed_adapters = true          # calls of different adapters share a batch
    prefix_caching = true          # a prompt prefix already in the KV cache is reused
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from control_plane.protocol import LLMOptions

NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
SECRET_NAME_PATTERN = r"^[A-Z_][A-Z0-9_]{0,127}$"
ENTRY_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$"
#: The entry of every LLM function: thaw's own (``worker.llm.function``).
LLM_ENTRY = "worker.llm.function:LLMFunction"


class Scaling(BaseModel):
    model_config = ConfigDict(extra="forbid")

    min_replicas: int = Field(default=0, ge=0, le=64)
    max_replicas: int = Field(default=1, ge=0, le=64)
    idle_timeout_s: float = Field(default=300.0, ge=0, le=86400)
    target_concurrency: int = Field(default=1, ge=1, le=1024)

    @model_validator(mode="after")
    def _min_le_max(self) -> Scaling:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"scaling.min_replicas ({self.min_replicas}) exceeds max_replicas "
                f"({self.max_replicas})"
            )
        return self


class ScalingPatch(BaseModel):
    """A change to a deployed function's scaling (``PATCH .../scaling``): the fields
    sent replace the current ones, a field not sent (or null) keeps its value."""

    model_config = ConfigDict(extra="forbid")

    min_replicas: int | None = Field(default=None, ge=0, le=64)
    max_replicas: int | None = Field(default=None, ge=0, le=64)
    idle_timeout_s: float | None = Field(default=None, ge=0, le=86400)
    target_concurrency: int | None = Field(default=None, ge=1, le=1024)

    def applied_to(self, current: Scaling) -> Scaling:
        """``current`` with this change; raises ``pydantic.ValidationError`` when the
        merged scaling is invalid (e.g. min_replicas above the kept max_replicas)."""
        return Scaling.model_validate(
            {**current.model_dump(), **self.model_dump(exclude_none=True)}
        )


class Batching(BaseModel):
    """Dynamic batching: the replica's ``batch(inputs)`` gets up to ``max_batch_size``
    calls, gathered for at most ``max_wait_ms`` after the first (``worker.batcher``).
    A replica is then sent up to max(target_concurrency, max_batch_size) calls at once."""

    model_config = ConfigDict(extra="forbid")

    max_batch_size: int = Field(default=8, ge=1, le=1024)
    max_wait_ms: float = Field(default=10.0, ge=0, le=60_000)


class Routing(BaseModel):
    """Prefix-aware routing: calls whose prompts (``input[prompt_field]``) share their
    first ``prefix_chars`` characters prefer the same replica, so its prefix cache
    is reused (``services.router``)."""

    model_config = ConfigDict(extra="forbid")

    prompt_field: str = Field(min_length=1, max_length=200)
    prefix_chars: int = Field(default=256, ge=1, le=1_000_000)


class AdapterRef(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN)
    ref: str = Field(min_length=1, max_length=300, description="NAME:TAG of a pushed adapter")


class Limits(BaseModel):
    """A token bucket on the function's invokes (``control_plane.services.ratelimit``)."""

    model_config = ConfigDict(extra="forbid")

    calls_per_s: float = Field(gt=0, le=1_000_000)
    burst: int | None = Field(default=None, ge=1, le=1_000_000)


class FunctionSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN)
    bundle: str = Field(pattern=r"^blake3:[0-9a-f]{64}$", description="bundle manifest digest")
    entry: str = Field(pattern=ENTRY_PATTERN)
    model: str | None = Field(default=None, min_length=1, max_length=300)
    adapters: list[AdapterRef] = Field(default_factory=list, max_length=64)
    device: Literal["cpu", "cuda", "any"] = "any"
    scaling: Scaling = Field(default_factory=lambda: Scaling())
    batching: Batching | None = None  # None: one call per __call__
    routing: Routing | None = None  # None: least outstanding (and session affinity)
    limits: Limits | None = None  # None: no per-function rate limit
    timeout_s: float = Field(default=300.0, gt=0, le=86400)
    retries: int = Field(default=0, ge=0, le=10)
    # A streaming client that disconnects: "cancel" ends the call as cancelled (the
    # replica's outputs stop being forwarded, it serves the next call); "finish" runs on.
    on_disconnect: Literal["cancel", "finish"] = "cancel"
    env: dict[str, str] = Field(default_factory=dict)
    secrets: list[Annotated[str, Field(pattern=SECRET_NAME_PATTERN)]] = Field(
        default_factory=list, max_length=64
    )
    # runtime = "docker": the replica runs in a container over IMAGE (`thaw images push`)
    runtime: Literal["process", "docker"] = "process"
    image: str | None = Field(default=None, min_length=1, max_length=300)
    network: bool = False  # containers get no network unless this is set
    memory_bytes: int | None = Field(default=None, ge=64 << 20)
    cpus: float | None = Field(default=None, gt=0, le=1024)
    llm: LLMOptions | None = None  # an LLM function: thaw serves ``model`` (no code)

    @model_validator(mode="before")
    @classmethod
    def _llm_entry(cls, data: Any) -> Any:
        """An LLM function's entry is thaw's own; a spec with ``[llm]`` leaves it out."""
        if isinstance(data, dict) and data.get("llm") is not None and "entry" not in data:
            return {**data, "entry": LLM_ENTRY}
        return data

    @model_validator(mode="after")
    def _llm_function(self) -> FunctionSpec:
        if self.llm is None:
            if self.entry == LLM_ENTRY:
                raise ValueError(f"entry {LLM_ENTRY} serves an [llm] table; add one")
            return self
        if self.entry != LLM_ENTRY:
            raise ValueError("an [llm] function runs thaw's own code: leave entry out")
        if not self.model:
            raise ValueError('an [llm] function serves a pushed model: set model = "NAME:TAG"')
        if self.batching is not None:
            raise ValueError(
                "an [llm] function batches by itself (continuous batching, [llm] "
                "max_num_seqs): remove [batching]"
            )
        if "target_concurrency" not in self.scaling.model_fields_set:
            # Routing and autoscaling count sequences: a replica takes a full batch.
            self.scaling.target_concurrency = self.llm.max_num_seqs
        return self

    @property
    def replica_capacity(self) -> int:
        """Calls one replica is sent at once: enough to fill a batch when batching."""
        batch = self.batching.max_batch_size if self.batching else 1
        return max(self.scaling.target_concurrency, batch)

    @model_validator(mode="after")
    def _image_with_docker(self) -> FunctionSpec:
        if self.runtime == "docker" and not self.image:
            raise ValueError('runtime = "docker" needs image = "NAME:TAG" (thaw images push)')
        if self.runtime != "docker" and self.image:
            raise ValueError('image is only used with runtime = "docker"; set runtime too')
        return self

    @model_validator(mode="after")
    def _unique_adapter_names(self) -> FunctionSpec:
        names = [a.name for a in self.adapters]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"adapter names must be unique; repeated: {', '.join(dupes)}")
        return self
