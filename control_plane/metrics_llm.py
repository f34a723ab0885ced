"""Token-level metrics of LLM calls, named after vLLM's (``vllm:time_to_first_token_seconds``
→ ``thaw_llm_time_to_first_token_seconds``, ...) so its dashboards translate.

Observed once per LLM call as it ends (``services.llm_metrics``), from figures its
replica measured where tokens are made; the control plane adds only the wait
before the replica began the call (``queue_wait``, a cold start included), so the
time to first token is what the caller felt. The gauges are each LLM replica's
engine now, from its worker's heartbeat (``services.llm_metrics.refresh_engine_gauges``).
Part of the app's registry (``control_plane.metrics.Metrics.llm``).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# vLLM's buckets, with finer ones below where a small model on a fast path lands.
TTFT_BUCKETS_S = (
    *(0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75),
    *(1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0),
)
TOKEN_GAP_BUCKETS_S = (
    *(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2),
    *(0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0),
)
REQUEST_BUCKETS_S = (
    *(0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0),
    *(30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0),
)


class LLMMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.time_to_first_token_s = Histogram(
            "thaw_llm_time_to_first_token_seconds",
            "LLM calls: accepted to the first output token (the wait for a replica, a "
            "cold start included, plus the replica's time to first token)",
            ["function", "cold"],
            buckets=TTFT_BUCKETS_S,
            registry=registry,
        )
        self.inter_token_latency_s = Histogram(
            "thaw_llm_inter_token_latency_seconds",
            "LLM calls: each gap between two output tokens, as the replica timed it",
            ["function"],
            buckets=TOKEN_GAP_BUCKETS_S,
            registry=registry,
        )
        self.request_time_per_output_token_s = Histogram(
            "thaw_llm_request_time_per_output_token_seconds",
            "LLM calls: each call's mean time per output token after the first (TPOT)",
            ["function"],
            buckets=TOKEN_GAP_BUCKETS_S,
            registry=registry,
        )
        self.e2e_request_latency_s = Histogram(
            "thaw_llm_e2e_request_latency_seconds",
            "LLM calls: accepted to final state",
            ["function", "cold"],
            buckets=REQUEST_BUCKETS_S,
            registry=registry,
        )
        self.request_queue_time_s = Histogram(
            "thaw_llm_request_queue_time_seconds",
            "LLM calls: time in the replica before its engine took the request into the "
            "running batch (waiting for a batch slot, KV blocks or its adapter's turn)",
            ["function"],
            buckets=REQUEST_BUCKETS_S,
            registry=registry,
        )
        self.prompt_tokens = Counter(
            "thaw_llm_prompt_tokens",
            "LLM calls: prompt tokens processed",
            ["function"],
            registry=registry,
        )
        self.generation_tokens = Counter(
            "thaw_llm_generation_tokens",
            "LLM calls: output tokens generated (also of calls that failed or were cut short)",
            ["function"],
            registry=registry,
        )

        # The engines' load, per replica, from the workers' heartbeats.
        def replica_gauge(name: str, documentation: str) -> Gauge:
            return Gauge(name, documentation, ["function", "replica"], registry=registry)

        self.num_requests_running = replica_gauge(
            "thaw_llm_num_requests_running", "Requests in an LLM replica's running batch"
        )
        self.num_requests_waiting = replica_gauge(
            "thaw_llm_num_requests_waiting",
            "Requests in an LLM replica waiting to join its batch (slots, KV blocks, adapter)",
        )
        self.kv_cache_usage_perc = replica_gauge(
            "thaw_llm_kv_cache_usage_perc",
            "Share of an LLM replica's KV-cache blocks live requests hold (1 = full)",
        )
        self.num_requests_aborted = replica_gauge(
            "thaw_llm_num_requests_aborted",
            "Requests an LLM replica's engine cancelled before they finished (their callers "
            "left, their deadlines passed), freeing their sequences, since it started",
        )
        self.num_requests_running_max = replica_gauge(
            "thaw_llm_num_requests_running_max",
            "The most requests an LLM replica's running batch has held since it started",
        )
        self.cuda_graph_captures = replica_gauge(
            "thaw_llm_cuda_graph_captures",
            "CUDA graphs an LLM replica's engine captured for step shapes that came again, "
            "since its start (each stalls its batch for about two forwards)",
        )
        self.prefix_cache_queries = replica_gauge(
            "thaw_llm_prefix_cache_queries",
            "Prompt tokens an LLM replica's engine looked up in its prefix cache since it "
            "started (vLLM's prefix_cache_queries)",
        )
        self.prefix_cache_hits = replica_gauge(
            "thaw_llm_prefix_cache_hits",
            "Of the prompt tokens an LLM replica's engine looked up in its prefix cache, "
            "those found there and not computed again, since it started",
        )
        self.cuda_graph_eager_steps = replica_gauge(
            "thaw_llm_cuda_graph_eager_steps",
            "Steps an LLM replica's engine on CUDA graphs ran eagerly, on the first coming "
            "of their shape, since its start",
        )
