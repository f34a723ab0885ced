"""Figures of the cold-start bench: summaries, ratios against the issue's targets, table, PNG.

The JSON document (``--json``) is ``figures(...)``'s return value::

    {"scenarios": {key: {"label", "median_s", "p95_s", "p99_s", "n", "phases_ms"}},
     "trace": {"scale_to_zero" | "keep_warm": {"calls", "cold_calls", "cold_rate",
                                               "median_s", "p99_s"}, "shape": {...}},
     "ratios": [{"name", "value", "target", "met"}], "model": {...}, "machine": {...}}

Ratios are thaw's median over the baseline's median (lower is better); the
adapter row is a p99 in seconds against 0.020 s.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench._coldstart_scenarios import CALL_TIMINGS, Sample, TraceShape
from bench._common import Column, TableSpec, markdown_table, median_phases, percentile

LABELS = {
    "naive": "naive: fresh process, torch+transformers, from_pretrained, forward",
    "thaw_pool_hit": "thaw cold start, pool hit, weights in disk cache",
    "thaw_ram_tier": "thaw cold start, pool hit, weights in the host-RAM tier",
    "thaw_pool_miss": "thaw cold start, pool miss (a fork of the zygote), weights in disk cache",
    "thaw_pool_miss_spawn": "thaw cold start, pool miss, no zygote (a new interpreter)",
    "boto3_s3": "boto3 download, then from_pretrained + forward",
    "thaw_s3": "thaw cold start, weights only in S3 (empty worker cache)",
    "thaw_warm": "thaw warm call",
    "adapter_switch_call": "warm call switching adapter (rank 16)",
    "adapter_switch": "adapter switch (set_adapter, measured in the replica)",
}
# The example run's rows (``--model DIR`` runs ``bench._coldstart_model.ROWS``).
SCENARIOS = tuple(k for k in LABELS if k != "thaw_ram_tier")


@dataclass(frozen=True)
class Target:
    name: str
    numerator: str
    denominator: str | None  # None: the numerator's p99 in seconds against ``target``
    target: float


TARGETS = (
    Target("pool hit / naive", "thaw_pool_hit", "naive", 0.1),
    Target("pool miss / naive", "thaw_pool_miss", "naive", 1 / 3),
    Target("S3-only / boto3 download-then-load", "thaw_s3", "boto3_s3", 0.5),
    Target("adapter switch p99 (s)", "adapter_switch", None, 0.020),
)


def summary(times_s: Sequence[float], phases: Sequence[dict[str, float]] = ()) -> dict[str, Any]:
    out: dict[str, Any] = {
        "n": len(times_s),
        "median_s": statistics.median(times_s),
        "p95_s": percentile(times_s, 95),
        "p99_s": percentile(times_s, 99),
    }
    out["phases_ms"] = dict(sorted(median_phases(phases).items()))
    return out


def sample_summary(samples: Sequence[Sample]) -> dict[str, Any]:
    return summary([s.total_s for s in samples], [s.server_timing_ms for s in samples])


def trace_summary(samples: Sequence[Sample]) -> dict[str, Any]:
    cold = sum(s.cold for s in samples)
    times = [s.total_s for s in samples]
    return {
        "calls": len(samples),
        "cold_calls": cold,
        "cold_rate": cold / len(samples),
        "median_s": statistics.median(times),
        "p99_s": percentile(times, 99),
    }


def ratios(
    scenarios: dict[str, dict[str, Any]], targets: Sequence[Target] = TARGETS
) -> list[dict[str, Any]]:
    out = []
    for t in targets:
        num = scenarios.get(t.numerator)
        den = scenarios.get(t.denominator) if t.denominator else None
        if num is None or (t.denominator and den is None):
            value = None
        elif den is None:
            value = num["p99_s"]
        else:
            value = num["median_s"] / den["median_s"] if den["median_s"] > 0 else None
        met = None if value is None else value <= t.target
        out.append({"name": t.name, "value": value, "target": t.target, "met": met})
    return out


def figures(
    scenarios: dict[str, dict[str, Any]],
    trace: dict[str, dict[str, Any]],
    shape: TraceShape,
    extra: dict[str, Any],
) -> dict[str, Any]:
    for key, s in scenarios.items():
        s["label"] = LABELS[key]
    return {
        "scenarios": scenarios,
        "trace": {**trace, "shape": asdict(shape)},
        "ratios": ratios(scenarios),
        **extra,
    }


def _phase_text(timing_ms: dict[str, float], limit: int = 6) -> str:
    """The largest cold-start phases; call timings only for rows that have no phases."""
    phases = {k: v for k, v in timing_ms.items() if k not in CALL_TIMINGS}
    shown = phases if any(v >= 0.5 for v in phases.values()) else timing_ms
    top = sorted(shown.items(), key=lambda kv: -kv[1])[:limit]
    return " ".join(f"{k}={v:.0f}" for k, v in top if v >= 0.5)


def scenario_table(doc: dict[str, Any]) -> TableSpec:
    spec = TableSpec(
        title="thaw bench coldstart: seconds per call (client-measured, fresh processes)",
        columns=[
            Column("scenario", "left"),
            Column("n"),
            Column("median s"),
            Column("p95 s"),
            Column("p99 s"),
            Column("phase medians, ms (largest)", "left"),
        ],
    )
    for key in LABELS:
        s = doc["scenarios"].get(key)
        if s is None:
            continue
        row = [s["label"], str(s["n"]), f"{s['median_s']:.3f}", f"{s['p95_s']:.3f}"]
        spec.rows.append([*row, f"{s['p99_s']:.3f}", _phase_text(s["phases_ms"])])
    return spec


def trace_table(doc: dict[str, Any]) -> TableSpec:
    shape = doc["trace"]["shape"]
    spec = TableSpec(
        title=(
            f"bursty trace: {shape['bursts']} bursts x {shape['calls_per_burst']} calls, "
            f"idle gaps {shape['idle_gap_s']:g} s > idle timeout"
        ),
        columns=[
            Column("mode", "left"),
            Column("calls"),
            Column("cold-start rate"),
            Column("median s"),
            Column("p99 s"),
        ],
    )
    for key, label in (
        ("scale_to_zero", "min_replicas=0"),
        ("keep_warm", "keep-warm (min_replicas=1)"),
    ):
        t = doc["trace"][key]
        spec.rows.append(
            [
                label,
                str(t["calls"]),
                f"{t['cold_rate']:.0%}",
                f"{t['median_s']:.3f}",
                f"{t['p99_s']:.3f}",
            ]
        )
    return spec


def ratio_table(doc: dict[str, Any]) -> TableSpec:
    spec = TableSpec(
        title="targets (lower is better)",
        columns=[
            Column("ratio", "left"),
            Column("reached"),
            Column("target"),
            Column("met", "left"),
        ],
    )
    for r in doc["ratios"]:
        value = "n/a" if r["value"] is None else f"{r['value']:.3f}"
        met = "n/a" if r["met"] is None else ("yes" if r["met"] else "no")
        spec.rows.append([r["name"], value, f"{r['target']:.3f}", met])
    return spec


def write_png(doc: dict[str, Any], path: Path) -> None:
    """Median bars with p95 whiskers per scenario, and the trace's cold rate and p99."""
    import matplotlib

    matplotlib.use("Agg")  # no display: write the file only
    import matplotlib.pyplot as plt

    keys = [k for k in SCENARIOS if k in doc["scenarios"]]
    med = [doc["scenarios"][k]["median_s"] for k in keys]
    err = [max(0.0, doc["scenarios"][k]["p95_s"] - m) for k, m in zip(keys, med, strict=True)]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [3, 1]})
    ax1.barh(keys, med, xerr=[[0.0] * len(err), err], color="#4477aa")
    ax1.invert_yaxis()
    ax1.set_xscale("log")
    ax1.set_xlabel("seconds (median, whisker to p95; log scale)")
    ax1.set_title("cold start and warm paths")
    modes = ["scale_to_zero", "keep_warm"]
    p99 = [doc["trace"][m]["p99_s"] for m in modes]
    rates = [doc["trace"][m]["cold_rate"] for m in modes]
    bars = ax2.bar(["min=0", "keep-warm"], p99, color=["#cc6677", "#117733"])
    for bar, rate in zip(bars, rates, strict=True):
        ax2.annotate(
            f"cold {rate:.0%}",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
        )
    ax2.set_ylabel("p99 seconds")
    ax2.set_title("bursty trace")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(doc: dict[str, Any]) -> str:
    """The three tables as GitHub markdown (for ``bench/README.md``)."""
    tables = (scenario_table(doc), trace_table(doc), ratio_table(doc))
    return "\n\n".join(f"**{t.title}**\n\n{markdown_table(t)}" for t in tables)


if __name__ == "__main__":  # python -m bench._coldstart_report results.json
    import json
    import sys

    print(markdown(json.loads(Path(sys.argv[1]).read_text())))
