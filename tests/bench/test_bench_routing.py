"""bench/routing.py on a small workload: every call served once under each policy,
and prefix routing keeps more prefixes cached than least outstanding."""

from __future__ import annotations

from bench.routing import POLICIES, Workload, run, table


def test_each_policy_serves_every_call_and_prefix_routing_hits_the_cache_more() -> None:
    rows = run(Workload(calls=2000, load=0.8))
    assert [r["policy"] for r in rows] == list(POLICIES)
    assert all(r["calls"] == 2000 for r in rows)
    by = {r["policy"]: r for r in rows}
    assert by["prefix (bounded)"]["hit_rate"] > by["least outstanding"]["hit_rate"]
    assert by["prefix (unbounded)"]["hit_rate"] >= by["prefix (bounded)"]["hit_rate"]
    # The bound keeps load flatter than hashing alone.
    assert (
        by["prefix (bounded)"]["busiest_over_mean"] < by["prefix (unbounded)"]["busiest_over_mean"]
    )
    assert all(0 < r["p50_s"] <= r["p99_s"] for r in rows)
    assert table(rows).count("\n") == len(rows) + 1
