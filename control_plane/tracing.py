"""Traces of calls, exported over OTLP/HTTP: the only module that imports the OTel SDK.

thaw already records where a call's time went (timings, cold-start phases);
spans are built from those records after the fact (:class:`SpanRecord`, with
their real start and end times) rather than measured again. One call is one
trace, whose id is the call id (a uuid4 is 128 bits, like a trace id), so
every process finds the trace from the call alone, without storing it::

    thaw.invoke                  API process: the HTTP request (root)
    └─ thaw.call                 control plane: accepted → final (id from the call id)
       ├─ thaw.queue_wait        accepted → dispatched
       ├─ thaw.cold_start        a cold call's replica start, one child per phase
       │  └─ thaw.phase.<name>   schedule, pool_acquire, … user_setup
       ├─ thaw.first_output      accepted → first output
       └─ thaw.worker.run_call   worker: the RunCall (its ``traceparent`` names thaw.call)
          └─ thaw.execution      the replica running the function

Sampling is tail-based, per process (:mod:`control_plane.tail_sampling`).
Without ``otlp_endpoint`` nothing is built and :data:`NO_TRACING` drops records.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from control_plane.protocol import REPLICA_PHASES
from control_plane.settings import Settings
from control_plane.tail_sampling import SamplingPolicy, TailSamplingProcessor

TRACES_PATH = "/v1/traces"
_SCOPE = InstrumentationScope("thaw")
AttrValue = str | bool | int | float


@dataclass(frozen=True)
class TracingConfig:
    """Where spans go and which traces are kept (from ``Settings``)."""

    endpoint: str  # OTLP/HTTP base URL (``/v1/traces`` is appended) or the traces URL
    service_name: str
    policy: SamplingPolicy = field(default_factory=SamplingPolicy)

    @property
    def traces_url(self) -> str:
        base = self.endpoint.rstrip("/")
        return base if base.endswith(TRACES_PATH) else base + TRACES_PATH


@dataclass(frozen=True)
class SpanRecord:
    """One finished span. ``parent_span_id`` 0: a trace's root; ``remote_parent``: the
    parent lives in another process (this span is then a local root for sampling)."""

    name: str
    trace_id: int
    span_id: int
    start_s: float  # unix seconds
    end_s: float
    parent_span_id: int = 0
    remote_parent: bool = False
    attributes: Mapping[str, AttrValue] = field(default_factory=dict)
    error: str | None = None
    kind: SpanKind = SpanKind.INTERNAL


# --- ids ------------------------------------------------------------------------


def call_trace_id(call_id: str) -> int:
    """The trace id of a call: its uuid4 hex, or a digest of any other id."""
    try:
        value = int(call_id, 16)
    except ValueError:
        value = 0
    if len(call_id) == 32 and value:
        return value
    return int.from_bytes(hashlib.blake2b(call_id.encode(), digest_size=16).digest(), "big")


def derived_span_id(call_id: str, role: str) -> int:
    """A span id every process computes alike (``role``: "invoke", "call")."""
    digest = hashlib.blake2b(f"{call_id}/{role}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") or 1


def new_span_id() -> int:
    return random.getrandbits(64) or 1


def traceparent(trace_id: int, span_id: int) -> str:
    """W3C ``traceparent`` (version 00, sampled)."""
    return f"00-{trace_id:032x}-{span_id:016x}-01"


def call_traceparent(call_id: str) -> str:
    """What a ``RunCall`` carries: the call's ``thaw.call`` span is the worker's parent."""
    return traceparent(call_trace_id(call_id), derived_span_id(call_id, "call"))


def parse_traceparent(value: str | None) -> tuple[int, int] | None:
    """(trace id, parent span id), or None for a missing or malformed header."""
    if not value:
        return None
    parts = value.strip().split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    try:
        trace_id, span_id = int(parts[1], 16), int(parts[2], 16)
    except ValueError:
        return None
    return (trace_id, span_id) if trace_id and span_id else None


def phase_spans(
    phases_ms: Mapping[str, float], start_s: float, trace_id: int, parent_id: int, prefix: str
) -> list[SpanRecord]:
    """One span per replica start phase (``REPLICA_PHASES`` order), back to back from
    ``start_s``, each named ``prefix`` + the phase."""
    spans: list[SpanRecord] = []
    t_s = start_s
    for phase in REPLICA_PHASES:
        if phase not in phases_ms:
            continue
        duration_s = max(0.0, phases_ms[phase]) / 1000
        spans.append(
            SpanRecord(
                name=f"{prefix}{phase}",
                trace_id=trace_id,
                span_id=new_span_id(),
                parent_span_id=parent_id,
                start_s=t_s,
                end_s=t_s + duration_s,
                attributes={"thaw.phase": phase},
            )
        )
        t_s += duration_s
    return spans


def phases_s(phases_ms: Mapping[str, float]) -> float:
    """The replica start phases' total, in seconds."""
    return sum(max(0.0, phases_ms[p]) for p in REPLICA_PHASES if p in phases_ms) / 1000


# --- export ---------------------------------------------------------------------


class Tracing:
    """Exports span records of one process; thread-safe."""

    def __init__(self, config: TracingConfig, processor: SpanProcessor | None = None) -> None:
        self.config = config
        self.resource = Resource.create({"service.name": config.service_name})
        exporter_side = processor or BatchSpanProcessor(
            OTLPSpanExporter(endpoint=config.traces_url, timeout=5), schedule_delay_millis=500
        )
        self.processor = TailSamplingProcessor(exporter_side, config.policy)

    @property
    def enabled(self) -> bool:
        return True

    def emit(self, records: Sequence[SpanRecord]) -> None:
        """Hand finished spans to the sampler; children before their local root."""
        for record in sorted(records, key=_is_local_root):
            self.processor.on_end(self._readable(record))

    def _readable(self, r: SpanRecord) -> ReadableSpan:
        flags = TraceFlags(TraceFlags.SAMPLED)
        context = SpanContext(r.trace_id, r.span_id, is_remote=False, trace_flags=flags)
        parent = None
        if r.parent_span_id:
            parent = SpanContext(
                r.trace_id, r.parent_span_id, is_remote=r.remote_parent, trace_flags=flags
            )
        status = Status(StatusCode.ERROR, r.error) if r.error else Status(StatusCode.UNSET)
        return ReadableSpan(
            name=r.name,
            context=context,
            parent=parent,
            resource=self.resource,
            attributes=dict(r.attributes),
            kind=r.kind,
            status=status,
            start_time=_ns(r.start_s),
            end_time=_ns(max(r.start_s, r.end_s)),
            instrumentation_scope=_SCOPE,
        )

    def flush(self, timeout_ms: int = 5000) -> bool:
        return self.processor.force_flush(timeout_ms)

    def close(self) -> None:
        self.processor.shutdown()


class NoTracing(Tracing):
    """No endpoint configured: records are dropped, nothing is built."""

    def __init__(self) -> None:
        pass

    @property
    def enabled(self) -> bool:
        return False

    def emit(self, records: Sequence[SpanRecord]) -> None:
        return None

    def flush(self, timeout_ms: int = 5000) -> bool:
        return True

    def close(self) -> None:
        return None


NO_TRACING: Tracing = NoTracing()


def tracing_config(settings: Settings, service_name: str) -> TracingConfig | None:
    """The process's tracing from its settings; None without ``otlp_endpoint``."""
    if not settings.otlp_endpoint:
        return None
    policy = SamplingPolicy(settings.trace_slow_threshold_ms, settings.trace_sample_ratio)
    return TracingConfig(settings.otlp_endpoint, service_name, policy)


def open_tracing(config: TracingConfig | None) -> Tracing:
    return Tracing(config) if config is not None else NO_TRACING


def _is_local_root(r: SpanRecord) -> bool:
    return r.parent_span_id == 0 or r.remote_parent


def _ns(t_s: float) -> int:
    return int(t_s * 1e9)
