"""``thaw loadtest`` results: the summary (pure), its table, and its chart.

The summary is one JSON object (``--json``)::

    calls, ok, errors, error_examples, elapsed_s, throughput_per_s (ok calls/s)
    latency_ms / ttft_ms       {p50, p90, p95, p99, max} over ok calls (null: none)
    cold / warm                {calls, latency_ms, ttft_ms}, split by X-Thaw-Cold
    queue                      [{t_s, queue_depth, ready_replicas}], max_queue_depth
    per_second                 [{t_s, calls, errors}] by due time

On an LLM function (``llm: true``) also::

    tpot_ms                    {p50, p90, p95, p99, max}, in all, cold and warm
    prompt_tokens, completion_tokens, output_tokens_per_s (completion tokens/s)
    goodput                    {slo_ttft_ms, slo_tpot_ms, calls, share, per_s}: the
                               calls that succeeded within every SLO given (share of
                               all calls sent); null when no SLO was given
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


def _group(calls: Sequence[CallSample], llm: bool) -> dict[str, Any]:
    ok = [c for c in calls if c.ok]
    group = {
        "calls": len(calls),
        "latency_ms": quantiles_ms([c.latency_s for c in ok]),
        "ttft_ms": quantiles_ms([c.ttft_s for c in ok if c.ttft_s is not None]),
    }
    if llm:
        group["tpot_ms"] = quantiles_ms([c.tpot_s for c in ok if c.tpot_s is not None])
    return group


def meets_slo(c: CallSample, slo_ttft_ms: float | None, slo_tpot_ms: float | None) -> bool:
    """Succeeded, and within each SLO given (a call of one token has no TPOT to miss).

    A call that succeeded with no text (the model ended at once) had its answer, empty,
    when it ended: that time is what it is held to for the TTFT SLO."""
    if not c.ok:
        return False
    first_s = c.ttft_s if c.ttft_s is not None else c.latency_s
    if slo_ttft_ms is not None and first_s * 1000 > slo_ttft_ms:
        return False
    return slo_tpot_ms is None or c.tpot_s is None or c.tpot_s * 1000 <= slo_tpot_ms


def _llm_figures(
    calls: Sequence[CallSample],
    elapsed_s: float,
    slo_ttft_ms: float | None,
    slo_tpot_ms: float | None,
) -> dict[str, Any]:
    ok = [c for c in calls if c.ok]
    completion = sum(c.completion_tokens or 0 for c in ok)
    goodput = None
    if slo_ttft_ms is not None or slo_tpot_ms is not None:
        good = sum(meets_slo(c, slo_ttft_ms, slo_tpot_ms) for c in calls)
        goodput = {
            "slo_ttft_ms": slo_ttft_ms,
            "slo_tpot_ms": slo_tpot_ms,
            "calls": good,
            "share": good / len(calls) if calls else None,
            "per_s": good / elapsed_s if elapsed_s > 0 else 0.0,
        }
    return {
        "prompt_tokens": sum(c.prompt_tokens or 0 for c in ok),
        "completion_tokens": completion,
        "output_tokens_per_s": completion / elapsed_s if elapsed_s > 0 else 0.0,
        "goodput": goodput,
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
    slo_ttft_ms: float | None = None,
    slo_tpot_ms: float | None = None,
) -> dict[str, Any]:
    """Everything the run measured, as one JSON-ready object; ``params["llm"]`` adds
    the token figures and goodput."""
    llm = bool(params.get("llm"))
    ok = [c for c in calls if c.ok]
    errors = [c for c in calls if not c.ok]
    examples = list(dict.fromkeys(c.error or "" for c in errors))[:MAX_ERROR_EXAMPLES]
    doc = {
        **params,
        "calls": len(calls),
        "ok": len(ok),
        "errors": len(errors),
        "error_examples": examples,
        "elapsed_s": elapsed_s,
        "throughput_per_s": len(ok) / elapsed_s if elapsed_s > 0 else 0.0,
        **_group(calls, llm),
        "cold": _group([c for c in calls if c.cold is True], llm),
        "warm": _group([c for c in calls if c.cold is False], llm),
        "queue": [
            {"t_s": q.t_s, "queue_depth": q.queue_depth, "ready_replicas": q.ready_replicas}
            for q in queue
        ],
        "max_queue_depth": max((q.queue_depth for q in queue), default=None),
        "per_second": per_second(calls),
    }
    if llm:
        doc.update(_llm_figures(calls, elapsed_s, slo_ttft_ms, slo_tpot_ms))
    return doc


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


def llm_table(doc: dict[str, Any]) -> TableSpec:
    """TTFT and TPOT percentiles, cold and warm apart; tokens/s and goodput below."""
    load = (
        f"{doc['concurrency']} concurrent streams"
        if doc.get("concurrency")
        else f"{doc['rate_per_s']:g} streams/s {doc['arrival']}"
    )
    cols = [f"{m} {q}" for m in ("TTFT", "TPOT") for q in ("p50", "p90", "p95", "p99")]
    caption = (
        f"{doc['ok']} ok, {doc['errors']} errors; {doc['output_tokens_per_s']:.1f} output "
        f"tokens/s ({doc['completion_tokens']} tokens, {doc['prompt_tokens']} prompt tokens)"
    )
    goodput = doc.get("goodput")
    if goodput is not None:
        slos = [
            f"{name} <= {goodput[key]:g} ms"
            for name, key in (("TTFT", "slo_ttft_ms"), ("TPOT", "slo_tpot_ms"))
            if goodput[key] is not None
        ]
        share = "-" if goodput["share"] is None else f"{goodput['share'] * 100:.1f}%"
        caption += (
            f"; goodput {share} of calls ({goodput['per_s']:.2f}/s) within {' and '.join(slos)}"
        )
    spec = TableSpec(
        title=f"thaw loadtest {doc['model']}: {load}, {doc['duration_s']:g} s (ms)",
        columns=[Column("", "left"), Column("calls"), *(Column(c) for c in cols)],
        caption=caption,
    )
    for label, group in (("all", doc), ("warm", doc["warm"]), ("cold", doc["cold"])):
        row = [label, str(group["calls"])]
        for key in ("ttft_ms", "tpot_ms"):
            row += [_ms(group[key], q) for q in ("p50", "p90", "p95", "p99")]
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
