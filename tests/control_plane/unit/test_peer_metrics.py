"""``/metrics`` for a server of several processes: the one scraped merges the others'
metrics into its own (``metrics.merged``)."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from control_plane.metrics import Metrics, merged


def series_values(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text.decode())
        for s in fam.samples
    }


def process_metrics(calls: int, queued: int) -> Metrics:
    m = Metrics()
    for _ in range(calls):
        m.call_latency_s.labels("echo", "false", "succeeded").observe(0.02)
    m.cold_starts.labels("echo").inc()
    m.queue_depth.labels("echo").set(queued)
    return m


def test_counts_are_summed_and_gauges_are_this_processes() -> None:
    here, peer = process_metrics(calls=2, queued=1), process_metrics(calls=3, queued=9)
    peer.queue_depth.labels("gone").set(4)  # a peer's older refresh: not shown
    peer.adapter_hits.labels("echo").inc()  # a series only a peer has: counted
    out = series_values(merged(here.exposition(), [peer.exposition()]))
    series = (("cold", "false"), ("function", "echo"), ("status", "succeeded"))
    assert out[("thaw_call_latency_seconds_count", series)] == 5
    assert out[("thaw_call_latency_seconds_sum", series)] == pytest.approx(0.1)
    assert out[("thaw_call_latency_seconds_bucket", (*series[:2], ("le", "0.025"), series[2]))] == 5
    assert out[("thaw_cold_starts_total", (("function", "echo"),))] == 2
    assert out[("thaw_queue_depth", (("function", "echo"),))] == 1
    assert ("thaw_queue_depth", (("function", "gone"),)) not in out
    hits = [v for (name, _), v in out.items() if name.startswith("thaw_adapter_hits_total")]
    assert hits == [1]
    created = ("thaw_cold_starts_created", (("function", "echo"),))
    assert out[created] == min(
        series_values(here.exposition())[created], series_values(peer.exposition())[created]
    )


def test_alone_the_exposition_is_unchanged() -> None:
    m = process_metrics(calls=1, queued=2)
    assert series_values(merged(m.exposition(), [])) == series_values(m.exposition())
