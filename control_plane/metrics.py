"""Prometheus metrics, one registry per app (so tests and apps never share counters)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from control_plane.metrics_llm import LLMMetrics

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

        self.llm = LLMMetrics(self.registry)  # token-level figures of LLM calls

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def set_series(gauge: Gauge, values: Mapping[tuple[str, ...], float]) -> None:
    """Make ``gauge`` export exactly ``values`` (label values → value): each set in
    place, then the others removed, so a scrape at the same moment (a tick and a
    scrape both refresh) never misses a series that stays."""
    for labels, value in values.items():
        gauge.labels(*labels).set(value)
    exported = {tuple(s.labels.values()) for metric in gauge.collect() for s in metric.samples}
    for labels in exported - values.keys():
        gauge.remove(*labels)


COUNTED = ("counter", "histogram", "summary")
_CREATED = "_created"


def merged(local: bytes, peers: Iterable[bytes]) -> bytes:
    """One exposition for all the processes of one server (``control_plane.peers``):
    counters and histograms summed across them; a series' creation time, the
    earliest; the gauges as this process has them (every gauge is refreshed from
    the database for the scrape: a peer's are as old as its last scrape or tick)."""
    parsed = [list(text_string_to_metric_families(t.decode())) for t in (local, *peers)]
    counted = {f.name for fams in parsed for f in fams if f.type in COUNTED}
    families: dict[str, Metric] = {}
    samples: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], Sample]] = {}
    for n, fams in enumerate(parsed):  # this process's first
        for fam in fams:
            combine = _combiner(fam, counted)
            if combine is None and n > 0:
                continue  # a peer's gauge
            families.setdefault(fam.name, fam)
            kept = samples.setdefault(fam.name, {})
            for sample in fam.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                old = kept.get(key)
                if old is not None:
                    assert combine is not None  # a gauge's series are this process's alone
                    sample = sample._replace(value=combine(old.value, sample.value))
                kept[key] = sample
    out = []
    for name, fam in families.items():
        metric = Metric(fam.name, fam.documentation, fam.type, fam.unit)
        metric.samples = list(samples[name].values())
        out.append(metric)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(out))
    return generate_latest(registry)


def _combiner(fam: Metric, counted: set[str]) -> Callable[[float, float], float] | None:
    """How the processes' values of a series of ``fam`` combine; None: they do not
    (a gauge: this process's alone)."""
    if fam.type in COUNTED:
        return lambda a, b: a + b
    if fam.name.endswith(_CREATED) and fam.name[: -len(_CREATED)] in counted:
        return min
    return None


class _Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)
