"""``thaw loadtest`` results: the summary (pure), its table, and its chart.

The summary is one JSON object (``--json``)::

    calls, ok, errors, error_examples, elapsed_s, throughput_per_s (ok calls/s)
    latency_ms / ttft_ms       {p50, p90, p95, p99, max} over ok calls (null: none)
    cold / warm                {calls, latency_ms, ttft_ms}, split by X-Thaw-Cold
    queue                      [{t_s, queue_depth, ready_replicas}], max_queue_depth
    per_second                 [{t_s, calls, errors}] by due time
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cli.loadtest_run import CallSample, QueueSample
from cli.report import Column, TableSpec, percentile

QUANTILES = (50, 90, 95, 99)
MAX_ERROR_EXAMPLES = 5


def quantiles_ms(values_s: Sequence[float]) -> dict[str, float] | None:
    if not values_s:
        return None
    out = {f"p{q}": percentile(values_s, q) * 1000 for q in QUANTILES}
    out["max"] = max(values_s) * 1000
    return out


def _group(calls: Sequence[CallSample]) -> dict[str, Any]:
    ok = [c for c in calls if c.ok]
    return {
        "calls": len(calls),
        "latency_ms": quantiles_ms([c.latency_s for c in ok]),
        "ttft_ms": quantiles_ms([c.ttft_s for c in ok if c.ttft_s is not None]),
    }


def per_second(calls: Sequence[CallSample]) -> list[dict[str, Any]]:
    buckets: dict[int, list[int]] = {}
    for c in calls:
        b = buckets.setdefault(int(c.start_s), [0, 0])
        b[0] += 1
        b[1] += 0 if c.ok else 1
    return [{"t_s": t, "calls": n, "errors": e} for t, (n, e) in sorted(buckets.items())]


def summarize(
    calls: Sequence[CallSample],
    queue: Sequence[QueueSample],
    elapsed_s: float,
    params: dict[str, Any],
) -> dict[str, Any]:
    """Everything the run measured, as one JSON-ready object."""
    ok = [c for c in calls if c.ok]
    errors = [c for c in calls if not c.ok]
    examples = list(dict.fromkeys(c.error or "" for c in errors))[:MAX_ERROR_EXAMPLES]
    return {
        **params,
        "calls": len(calls),
        "ok": len(ok),
        "errors": len(errors),
        "error_examples": examples,
        "elapsed_s": elapsed_s,
        "throughput_per_s": len(ok) / elapsed_s if elapsed_s > 0 else 0.0,
        **_group(calls),
        "cold": _group([c for c in calls if c.cold is True]),
        "warm": _group([c for c in calls if c.cold is False]),
        "queue": [
            {"t_s": q.t_s, "queue_depth": q.queue_depth, "ready_replicas": q.ready_replicas}
            for q in queue
        ],
        "max_queue_depth": max((q.queue_depth for q in queue), default=None),
        "per_second": per_second(calls),
    }


def _ms(q: dict[str, float] | None, key: str) -> str:
    return "-" if q is None else f"{q[key]:.1f}"


def results_table(doc: dict[str, Any]) -> TableSpec:
    load = (
        f"{doc['concurrency']} concurrent clients"
        if doc.get("concurrency")
        else f"{doc['rate_per_s']:g} calls/s {doc['arrival']}"
    )
    cols = ["calls", "p50", "p90", "p95", "p99", "TTFT p50", "TTFT p99"]
    spec = TableSpec(
        title=f"thaw loadtest {doc['function']}: {load}, {doc['duration_s']:g} s (ms)",
        columns=[Column("", "left"), *(Column(c) for c in cols)],
        caption=(
            f"{doc['ok']} ok, {doc['errors']} errors, {doc['throughput_per_s']:.1f} calls/s; "
            f"max queue depth {_depth(doc['max_queue_depth'])}"
        ),
    )
    for label, group in (("all", doc), ("warm", doc["warm"]), ("cold", doc["cold"])):
        lat, ttft = group["latency_ms"], group["ttft_ms"]
        row = [label, str(group["calls"])]
        row += [_ms(lat, k) for k in ("p50", "p90", "p95", "p99")]
        row += [_ms(ttft, "p50"), _ms(ttft, "p99")]
        spec.rows.append(row)
    return spec


def _depth(value: float | None) -> str:
    return "not sampled" if value is None else f"{value:g}"


def write_png(doc: dict[str, Any], calls: Sequence[CallSample], path: Path) -> None:
    """Latency of every call over time (cold and warm), and queue depth over time."""
    try:
        import matplotlib
    except ImportError:
        raise RuntimeError(
            "the chart needs matplotlib: pip install matplotlib (or thaw[bench])"
        ) from None
    matplotlib.use("Agg")  # no display: write the file only
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    for label, color, pick in (
        ("warm", "#4477aa", lambda c: c.cold is not True),
        ("cold", "#cc6677", lambda c: c.cold is True),
    ):
        chosen = [c for c in calls if c.ok and pick(c)]
        ax1.scatter(
            [c.start_s for c in chosen],
            [c.latency_s * 1000 for c in chosen],
            s=6,
            color=color,
            label=label,
        )
    failed = [c for c in calls if not c.ok]
    if failed:
        ax1.scatter([c.start_s for c in failed], [0] * len(failed), marker="x", label="error")
    ax1.set_ylabel("latency ms")
    ax1.set_title(results_table(doc).title)
    ax1.legend(loc="upper right")
    queue = doc["queue"]
    ax2.step([q["t_s"] for q in queue], [q["queue_depth"] for q in queue], label="queue depth")
    ax2.step([q["t_s"] for q in queue], [q["ready_replicas"] for q in queue], label="ready")
    ax2.set_xlabel("seconds since start")
    ax2.set_ylabel("calls / replicas")
    ax2.legend(loc="upper right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
