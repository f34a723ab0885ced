"""Prometheus metrics, one registry per app (so tests and apps never share counters)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# Phases are often a few milliseconds (a pool hit, a cached adapter).
PHASE_BUCKETS_S = (0.001, 0.005, *LATENCY_BUCKETS_S)
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


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
        self.route_affinity = Counter(
            "thaw_route_affinity",
            "Calls with a session (X-Thaw-Session) or a prompt prefix: hit when the "
            "affinity's (first) replica took them, miss when the router passed it over, "
            "new for a session's first call",
            ["function", "kind", "outcome"],
            registry=self.registry,
        )
        self.cold_starts = Counter(
            "thaw_cold_starts", "Replicas that became ready", ["function"], registry=self.registry
        )
        self.batch_size = Histogram(
            "thaw_batch_size",
            "Calls per batch a batched function's replica formed (counted once per batch)",
            ["function"],
            buckets=BATCH_SIZE_BUCKETS,
            registry=self.registry,
        )
        self.batch_size_max = Gauge(
            "thaw_batch_size_max",
            "The configured max_batch_size of a batched function (next to thaw_batch_size)",
            ["function"],
            registry=self.registry,
        )
        self.function_target_concurrency = Gauge(
            "thaw_function_target_concurrency",
            "The active version's target concurrency per replica (alert rules join on it)",
            ["function"],
            registry=self.registry,
        )
        self.function_deployed_at_s = Gauge(
            "thaw_function_deployed_timestamp_seconds",
            "When the function's active version was deployed (unix seconds)",
            ["function"],
            registry=self.registry,
        )
        self.worker_gpu_utilization = Gauge(
            "thaw_worker_gpu_utilization_ratio",
            "Share of time each CUDA device of a worker was busy (NVML, from its heartbeat); "
            "exported to watch, never a scaling signal (queue depth is)",
            ["worker", "device"],
            registry=self.registry,
        )
        self.direct_calls = Counter(
            "thaw_direct_calls",
            "Synchronous calls that took the fast path to a worker's direct port, by "
            "outcome: ran (result back on the connection), lost (sent, result from the "
            "worker's report), unavailable (not sent: queued instead)",
            ["function", "outcome"],
            registry=self.registry,
        )

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
