"""Routing bench: what prefix-aware routing buys over least outstanding, simulated.

    python bench/routing.py [--replicas 4] [--calls 20000] [--load 0.8] [--json -|PATH]

A discrete-event simulation driving the control plane's own pure router
(``control_plane.services.router.route``) with Poisson arrivals. Each call's
prompt starts with one of ``--prefixes`` shared prefixes (Zipf-distributed,
like system prompts of a few popular apps); each replica keeps an LRU prefix
cache of ``--cache-prefixes`` entries and serves ``--concurrency`` calls at
once. A call whose prefix its replica holds takes ``--hit-s`` of service,
otherwise ``--miss-s`` (prefill of the prefix). Calls that find no room wait
in one FIFO queue, routed again as replicas free up, as the reconciler does.

Policies, same arrivals and service draws:

- ``least outstanding``: the default router (no prefix key);
- ``prefix (bounded)``: the router with the prompt's prefix (rendezvous
  hashing, spilling to the prefix's next replica past the affinity bound:
  1.25 times the mean load or half the replica's capacity);
- ``prefix (unbounded)``: rendezvous hashing only, waiting for the prefix's
  replica whatever the load (what the bound protects against).

It reports the prefix-cache hit rate, the busiest replica's share of the
calls over the mean, and the latency (wait + service) p50/p99 in simulated
seconds. No wall-clock time is measured: the figures are the policy's.
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import sys
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from control_plane.services.router import CallRoute, ReplicaView, rendezvous_order, route

POLICIES = ("least outstanding", "prefix (bounded)", "prefix (unbounded)")


@dataclass(frozen=True)
class Workload:
    replicas: int = 4
    concurrency: int = 4
    calls: int = 20_000
    load: float = 0.8  # offered load over the capacity at the miss service time
    prefixes: int = 32
    zipf_s: float = 1.1
    cache_prefixes: int = 8
    hit_s: float = 0.2
    miss_s: float = 1.0
    seed: int = 7


@dataclass
class Replica:
    id: str
    cache_size: int
    outstanding: int = 0
    served: int = 0
    cache: OrderedDict[int, None] = field(default_factory=OrderedDict)

    def take(self, prefix: int) -> bool:
        """Start a call; True when its prefix was cached (then refreshed)."""
        self.outstanding += 1
        self.served += 1
        hit = prefix in self.cache
        self.cache[prefix] = None
        self.cache.move_to_end(prefix)
        while len(self.cache) > self.cache_size:
            self.cache.popitem(last=False)
        return hit


@dataclass(frozen=True)
class Arrival:
    at_s: float
    prefix: int


def arrivals(w: Workload) -> list[Arrival]:
    rng = random.Random(w.seed)
    weights = [1 / (k + 1) ** w.zipf_s for k in range(w.prefixes)]
    rate_per_s = w.load * w.replicas * w.concurrency / w.miss_s
    t, out = 0.0, []
    for prefix in rng.choices(range(w.prefixes), weights, k=w.calls):
        t += rng.expovariate(rate_per_s)
        out.append(Arrival(t, prefix))
    return out


Chooser = Callable[[list[Replica], int, int], Replica | None]


def _views(replicas: Sequence[Replica]) -> list[ReplicaView]:
    return [ReplicaView(r.id, "ready", 1, r.outstanding) for r in replicas]


def chooser(policy: str) -> Chooser:
    def choose(replicas: list[Replica], prefix: int, capacity: int) -> Replica | None:
        by_id = {r.id: r for r in replicas}
        if policy == "prefix (unbounded)":
            first = by_id[rendezvous_order(f"p{prefix}", list(by_id))[0]]
            return first if first.outstanding < capacity else None
        key = f"p{prefix}" if policy == "prefix (bounded)" else None
        chosen = route(_views(replicas), CallRoute(1, None, capacity, prefix_key=key))
        return by_id[chosen.replica.id] if chosen is not None else None

    return choose


def simulate(w: Workload, policy: str, calls: Sequence[Arrival]) -> dict[str, Any]:
    """One policy over ``calls``: hit rate, imbalance, latency percentiles."""
    replicas = [Replica(f"r{i}", w.cache_prefixes) for i in range(w.replicas)]
    choose = chooser(policy)
    events: list[tuple[float, int, str, int]] = []  # (time, seq, kind, index)
    for i, a in enumerate(calls):
        heapq.heappush(events, (a.at_s, i, "arrive", i))
    waiting: deque[int] = deque()
    latencies_s: list[float] = []
    hits, seq = 0, len(calls)
    running: dict[int, Replica] = {}

    def start(i: int, now: float) -> bool:
        nonlocal hits, seq
        r = choose(replicas, calls[i].prefix, w.concurrency)
        if r is None:
            return False
        hit = r.take(calls[i].prefix)
        hits += hit
        running[i] = r
        seq += 1
        heapq.heappush(events, (now + (w.hit_s if hit else w.miss_s), seq, "done", i))
        return True

    while events:
        now, _, kind, i = heapq.heappop(events)
        if kind == "arrive":
            if waiting or not start(i, now):
                waiting.append(i)
            continue
        running.pop(i).outstanding -= 1
        latencies_s.append(now - calls[i].at_s)
        while waiting and start(waiting[0], now):
            waiting.popleft()
    return _row(policy, w, hits, replicas, latencies_s)


def _row(
    policy: str, w: Workload, hits: int, replicas: list[Replica], latencies_s: list[float]
) -> dict[str, Any]:
    ordered = sorted(latencies_s)
    mean_served = sum(r.served for r in replicas) / len(replicas)
    return {
        "policy": policy,
        "calls": len(ordered),
        "hit_rate": hits / max(1, len(ordered)),
        "busiest_over_mean": max(r.served for r in replicas) / mean_served,
        "p50_s": ordered[len(ordered) // 2],
        "p99_s": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
    }


def run(w: Workload) -> list[dict[str, Any]]:
    calls = arrivals(w)
    return [simulate(w, policy, calls) for policy in POLICIES]


def table(rows: list[dict[str, Any]]) -> str:
    head = f"{'policy':<20} {'hit rate':>9} {'busiest/mean':>13} {'p50 s':>8} {'p99 s':>8}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['policy']:<20} {r['hit_rate']:>9.1%} {r['busiest_over_mean']:>13.2f} "
            f"{r['p50_s']:>8.2f} {r['p99_s']:>8.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = Workload()
    for name, value in defaults.__dict__.items():
        p.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    p.add_argument("--json", help="write the rows as JSON to PATH, or - for stdout")
    args = p.parse_args(argv)
    w = Workload(**{k: getattr(args, k) for k in defaults.__dict__})
    rows = run(w)
    doc = {"workload": w.__dict__, "rows": rows}
    if args.json == "-":
        print(json.dumps(doc, indent=2))
        print(table(rows), file=sys.stderr)
        return 0
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2))
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
