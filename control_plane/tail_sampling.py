"""Tail-based sampling: decide on a whole trace once its local root has ended.

Every call over the latency threshold and every call with an error is kept,
and a share (``sample_ratio``) of the rest. The share is chosen from a digest
of the trace id, so the processes of one call (API, control plane, worker)
keep or drop the same ordinary traces. A slow or failed call is kept by every
process that sees it slow or failed: the latency judged is the call's own
(``thaw.latency_ms`` on the local root, from its acceptance) when the root
carries it, else the root span's duration.

:class:`TailSamplingProcessor` buffers a trace's spans until its local root
(a span without a parent, or whose parent is in another process) ends, then
passes them all on or drops them. The buffer is bounded: the oldest
undecided traces are dropped first.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.trace import StatusCode

LATENCY_ATTRIBUTE = "thaw.latency_ms"
MAX_BUFFERED_TRACES = 10_000


@dataclass(frozen=True)
class SamplingPolicy:
    slow_threshold_ms: float = 1000.0
    sample_ratio: float = 0.01

    def __post_init__(self) -> None:
        if not 0.0 <= self.sample_ratio <= 1.0:
            raise ValueError(
                f"sample_ratio must be within [0, 1], not {self.sample_ratio}; "
                "set THAW_TRACE_SAMPLE_RATIO to a share such as 0.01"
            )


def ratio_point(trace_id: int) -> float:
    """Where a trace falls in [0, 1): the same in every process."""
    digest = hashlib.blake2b(trace_id.to_bytes(16, "big"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def keep_trace(policy: SamplingPolicy, latency_ms: float, error: bool, trace_id: int) -> bool:
    """The decision: errors and slow calls always, else the sampled share."""
    if error or latency_ms >= policy.slow_threshold_ms:
        return True
    return ratio_point(trace_id) < policy.sample_ratio


def root_latency_ms(root: ReadableSpan) -> float:
    attrs = root.attributes or {}
    latency = attrs.get(LATENCY_ATTRIBUTE)
    if isinstance(latency, int | float):
        return float(latency)
    if root.start_time is None or root.end_time is None:
        return 0.0
    return (root.end_time - root.start_time) / 1e6


def is_local_root(span: ReadableSpan) -> bool:
    return span.parent is None or span.parent.is_remote


class TailSamplingProcessor(SpanProcessor):
    """Buffers spans per trace; on a local root's end, forwards or drops them all."""

    def __init__(
        self,
        downstream: SpanProcessor,
        policy: SamplingPolicy,
        max_traces: int = MAX_BUFFERED_TRACES,
    ) -> None:
        self.downstream = downstream
        self.policy = policy
        self.max_traces = max_traces
        self._lock = threading.Lock()
        self._buffers: OrderedDict[int, list[ReadableSpan]] = OrderedDict()

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        trace_id = span.context.trace_id if span.context else 0
        with self._lock:
            spans = self._buffers.setdefault(trace_id, [])
            spans.append(span)
            if not is_local_root(span):
                while len(self._buffers) > self.max_traces:
                    self._buffers.popitem(last=False)
                return
            del self._buffers[trace_id]
        error = any(s.status.status_code is StatusCode.ERROR for s in spans)
        if keep_trace(self.policy, root_latency_ms(span), error, trace_id):
            for s in spans:
                self.downstream.on_end(s)

    def shutdown(self) -> None:
        self.downstream.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.downstream.force_flush(timeout_millis)
