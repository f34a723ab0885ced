"""Tail-based sampling: the pure decision, and the processor that buffers a trace."""

from __future__ import annotations

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor

from control_plane.tail_sampling import (
    SamplingPolicy,
    TailSamplingProcessor,
    keep_trace,
    ratio_point,
)
from control_plane.tracing import SpanRecord, Tracing, TracingConfig

POLICY = SamplingPolicy(slow_threshold_ms=500.0, sample_ratio=0.1)


def test_errors_and_slow_calls_are_always_kept() -> None:
    for trace_id in range(1, 200):
        assert keep_trace(POLICY, 10.0, True, trace_id)
        assert keep_trace(POLICY, 500.0, False, trace_id)
        assert keep_trace(POLICY, 9000.0, False, trace_id)


def test_the_rest_is_kept_in_the_configured_share_alike_everywhere() -> None:
    ids = [(i * 0x9E3779B97F4A7C15) % 2**128 for i in range(1, 5001)]
    kept = [t for t in ids if keep_trace(POLICY, 10.0, False, t)]
    assert 0.07 < len(kept) / len(ids) < 0.13
    # The same trace id gets the same answer (every process of a call agrees).
    assert kept == [t for t in ids if keep_trace(POLICY, 10.0, False, t)]
    assert all(0.0 <= ratio_point(t) < 1.0 for t in ids)
    nothing = SamplingPolicy(slow_threshold_ms=500.0, sample_ratio=0.0)
    everything = SamplingPolicy(slow_threshold_ms=500.0, sample_ratio=1.0)
    assert not any(keep_trace(nothing, 10.0, False, t) for t in ids)
    assert all(keep_trace(everything, 10.0, False, t) for t in ids)


def test_a_share_outside_zero_to_one_is_refused() -> None:
    try:
        SamplingPolicy(sample_ratio=1.5)
    except ValueError as exc:
        assert "THAW_TRACE_SAMPLE_RATIO" in str(exc)
    else:
        raise AssertionError("a share of 1.5 was accepted")


class Collect(SpanProcessor):
    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def on_end(self, span: ReadableSpan) -> None:
        self.spans.append(span)


def _tracing(policy: SamplingPolicy) -> tuple[Tracing, Collect]:
    sink = Collect()
    return Tracing(TracingConfig("http://unused", "test", policy), processor=sink), sink


def _trace(trace_id: int, root_ms: float, child_error: str | None = None) -> list[SpanRecord]:
    root = SpanRecord("root", trace_id, 1, start_s=100.0, end_s=100.0 + root_ms / 1000)
    child = SpanRecord("child", trace_id, 2, 100.0, 100.001, parent_span_id=1, error=child_error)
    return [child, root]


def _fast_dropped_id() -> int:
    return next(t for t in range(1, 10_000) if not keep_trace(POLICY, 1.0, False, t))


def test_processor_holds_spans_until_the_root_ends_then_keeps_or_drops_them_all() -> None:
    tracing, sink = _tracing(POLICY)
    dropped = _fast_dropped_id()
    child, root = _trace(dropped, 1.0)
    tracing.emit([child])
    assert sink.spans == []  # undecided: the root has not ended
    tracing.emit([root])
    assert sink.spans == []  # fast, no error, outside the share: dropped whole
    tracing.emit(_trace(dropped + 10_000, 800.0))  # slow: kept whole
    tracing.emit(_trace(dropped + 20_000, 1.0, child_error="boom"))  # an error in a child
    names = [(s.context.trace_id, s.name) for s in sink.spans if s.context]
    assert names == [
        (dropped + 10_000, "child"),
        (dropped + 10_000, "root"),
        (dropped + 20_000, "child"),
        (dropped + 20_000, "root"),
    ]


def test_a_remote_parent_makes_a_local_root_and_the_call_latency_decides() -> None:
    tracing, sink = _tracing(POLICY)
    trace_id = _fast_dropped_id()
    # The worker's span is short, but the call it belongs to was slow (queued long).
    run = SpanRecord(
        "run",
        trace_id,
        5,
        start_s=10.0,
        end_s=10.01,
        parent_span_id=7,
        remote_parent=True,
        attributes={"thaw.latency_ms": 2500.0},
    )
    tracing.emit([run])
    assert [s.name for s in sink.spans] == ["run"]
    assert sink.spans[0].parent is not None and sink.spans[0].parent.is_remote


def test_the_buffer_of_undecided_traces_is_bounded() -> None:
    sink = Collect()
    processor = TailSamplingProcessor(sink, POLICY, max_traces=3)
    tracing = Tracing(TracingConfig("http://unused", "test", POLICY), processor=sink)
    tracing.processor = processor
    for trace_id in range(1, 10):
        tracing.emit([SpanRecord("orphan", trace_id, 2, 1.0, 2.0, parent_span_id=1)])
    assert len(processor._buffers) == 3
    assert list(processor._buffers) == [7, 8, 9]
