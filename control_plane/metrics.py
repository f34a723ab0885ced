"""Prometheus metrics, one registry per app (so tests and apps never share counters)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# Phases are often a few milliseconds (a pool hit, a cached adapter).
PHASE_BUCKETS_S = (0.001, 0.005, *LATENCY_BUCKETS_S)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.call_latency_s = Histogram(
            "thaw_call_latency_seconds",
            "Accepted to final state, per function and cold/warm",
            ["function", "cold", "status"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.first_output_s = Histogram(
            "thaw_time_to_first_output_seconds",
            "Accepted to the first streamed output",
            ["function", "cold"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.queue_depth = Gauge(
            "thaw_queue_depth", "Calls waiting for a replica", ["function"], registry=self.registry
        )
        self.replicas = Gauge(
            "thaw_replicas", "Replicas by state", ["function", "state"], registry=self.registry
        )
        self.cold_start_phase_s = Histogram(
            "thaw_cold_start_phase_seconds",
            "Time in each cold-start phase (schedule … first_output), per function",
            ["function", "phase"],
            buckets=PHASE_BUCKETS_S,
            registry=self.registry,
        )
        self.call_timing_s = Histogram(
            "thaw_call_timing_seconds",
            "Call timings (queue_wait, execution, first_output, total, adapter_load)",
            ["function", "timing", "cold"],
            buckets=PHASE_BUCKETS_S,
            registry=self.registry,
        )
        self.adapter_hits = Counter(
            "thaw_adapter_hits",
            "Calls whose replica already held their adapter (as the worker reports)",
            ["function"],
            registry=self.registry,
        )
        self.adapter_misses = Counter(
            "thaw_adapter_misses",
            "Calls whose replica had to load their adapter (as the worker reports)",
            ["function"],
            registry=self.registry,
        )
        self.worker_pool_size = Gauge(
            "thaw_worker_pool_size",
            "Pre-warmed replica processes a worker keeps (its heartbeat)",
            ["worker"],
            registry=self.registry,
        )
        self.worker_pool_idle = Gauge(
            "thaw_worker_pool_idle",
            "Pool processes waiting to be specialized (when the worker reports it)",
            ["worker"],
            registry=self.registry,
        )
        self.worker_pool_busy = Gauge(
            "thaw_worker_pool_busy",
            "Pool processes being specialized or serving (when the worker reports it)",
            ["worker"],
            registry=self.registry,
        )
        self.cold_starts = Counter(
            "thaw_cold_starts", "Replicas that became ready", ["function"], registry=self.registry
        )

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
