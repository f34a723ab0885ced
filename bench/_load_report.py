"""The loader bench's results: one JSON document, a rich table, a markdown table.

Document shape (``--json``)::

    {"bench": "load", "date": ISO-8601 UTC, "machine": {...}, "options": {...},
     "model": {files, total_tensor_bytes, ...},
     "rows": [{"key": "thaw/warm", "label", "temperature", "device",
               "skipped": null | "why", "trials": [{load_s, process_s, ...}],
               "median_s", "p95_s", "min_s", "max_s", "bytes", "gb_per_s", "cpu_median_s",
               "checksum_ok", "page_cache", "thaw_report"}],
     "ratios": [{"name", "numerator", "denominator", "value", "target", "met",
                 "cpu_value"}]}                       # cpu_value: same ratio of GB per CPU-s

Times are seconds of the timed region (see ``bench._load_methods``); GB/s are
decimal (1e9 bytes). ``python -m bench._load_report RESULTS.json`` prints the
markdown tables for ``bench/README.md``.
"""

from __future__ import annotations

import datetime as dt
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from bench._common import (
    Column,
    TableSpec,
    gb_per_s,
    machine_description,
    markdown_table,
    render_table,
    summarize,
)
from bench._load_rows import RATIOS, Row, ratio_value
from bench._model import ModelInfo


def _median_trial(trials: list[dict[str, Any]]) -> dict[str, Any]:
    ordered = sorted(trials, key=lambda t: t["load_s"])
    return ordered[(len(ordered) - 1) // 2]


def summarize_row(row: Row, trials: list[dict[str, Any]]) -> dict[str, Any]:
    """One row's entry: its trials plus medians, throughput and the median trial's report."""
    out: dict[str, Any] = {
        "key": row.key,
        "family": row.family,
        "label": row.label,
        "temperature": row.temperature,
        "device": row.device,
        "skipped": None,
        "trials": trials,
    }
    s = summarize([t["load_s"] for t in trials])
    n_bytes = int(trials[0].get("bytes", 0))
    checks = [t["checksum_ok"] for t in trials if "checksum_ok" in t]
    out.update(
        median_s=s.median_s,
        p95_s=s.p95_s,
        min_s=s.min_s,
        max_s=s.max_s,
        bytes=n_bytes,
        gb_per_s=gb_per_s(n_bytes, s.median_s),
        checksum_ok=all(checks) if checks else None,
        process_median_s=statistics.median(t["process_s"] for t in trials),
        cpu_median_s=statistics.median(t.get("cpu_s", 0.0) for t in trials),
        page_cache=sorted({t["page_cache"] for t in trials if "page_cache" in t}),
        resident_fraction_max=max((t.get("resident_fraction", 0.0) for t in trials), default=0.0),
        thaw_report=_median_trial(trials).get("thaw_report"),
    )
    return out


def _skipped_row(row: Row, reason: str) -> dict[str, Any]:
    return {
        "key": row.key,
        "family": row.family,
        "label": row.label,
        "temperature": row.temperature,
        "device": row.device,
        "skipped": reason,
        "trials": [],
    }


def ratios_for(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every target ratio from summarized rows: wall-clock throughput, and per CPU-second."""
    ran = [r for r in rows if not r["skipped"]]
    gbps: dict[str, float] = {r["key"]: r["gb_per_s"] for r in ran}
    # Bytes per CPU second: how much work each byte costs, whatever else shares the machine.
    gb_per_cpu_s = {r["key"]: gb_per_s(r["bytes"], r["cpu_median_s"]) for r in ran}
    ratios: list[dict[str, Any]] = []
    for ratio in RATIOS:
        value = ratio_value(gbps, ratio)
        ratios.append({"name": ratio.name, "numerator": ratio.numerator,
                       "denominator": ratio.denominator, "target": ratio.target, "value": value,
                       "met": None if value is None else value >= ratio.target,
                       "cpu_value": ratio_value(gb_per_cpu_s, ratio)})  # fmt: skip
    return ratios


def build_document(
    options: dict[str, Any],
    model: ModelInfo,
    chosen: list[Row],
    records: dict[str, list[dict[str, Any]]],
    skipped: dict[str, str],
) -> dict[str, Any]:
    rows = []
    for row in chosen:
        if row.key in skipped:
            rows.append(_skipped_row(row, skipped[row.key]))
        else:
            rows.append(summarize_row(row, records[row.key]))
    ratios = ratios_for(rows)
    return {
        "bench": "load",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": machine_description(),
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in options.items()},
        "model": model.__dict__,
        "rows": rows,
        "ratios": ratios,
    }


def all_checksums_ok(doc: dict[str, Any]) -> bool:
    return all(r.get("checksum_ok") is not False for r in doc["rows"])


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f}"


def _stage(stage: dict[str, Any]) -> str:
    return f"{_gb(stage['bytes'])} / {stage['seconds']:.2f}"


def stages_table(doc: dict[str, Any]) -> TableSpec:
    """thaw's own report of its median trial: bytes (GB) / thread-busy seconds per stage."""
    cols = [Column("thaw row", "left"), Column("wall s"), Column("setup ms"),
            Column("fetch GB / s"), Column("verify+decode GB / s"), Column("place GB / s"),
            Column("from RAM tier GB"), Column("from cache GB"), Column("from store GB"),
            Column("chunks")]  # fmt: skip
    spec = TableSpec(title="thaw loader stages (median trial)", columns=cols)
    for r in doc["rows"]:
        rep = r.get("thaw_report")
        if r["skipped"] or not rep:
            continue
        spec.rows.append([
            f"{r['label']} ({r['temperature']})", f"{rep['wall_s']:.3f}",
            f"{rep['setup_s'] * 1e3:.0f}", _stage(rep["fetch"]), _stage(rep["verify_decompress"]),
            _stage(rep["place"]), _gb(rep.get("ram_tier_bytes", 0)), _gb(rep["cache_hit_bytes"]),
            _gb(rep["store_bytes"]),
            str(rep["chunks"]),
        ])  # fmt: skip
    return spec


def _check(row: dict[str, Any]) -> str:
    return {True: "ok", False: "WRONG", None: "-"}[row.get("checksum_ok")]


def results_table(doc: dict[str, Any]) -> TableSpec:
    cols = [Column("row", "left"), Column("start", "left"), Column("median s"),
            Column("p95 s"), Column("GB/s"), Column("CPU s"), Column("GB"),
            Column("bytes ok", "left"), Column("note", "left")]  # fmt: skip
    spec = TableSpec(title=f"loader bench, {doc['date']}", columns=cols)
    for r in doc["rows"]:
        if r["skipped"]:
            spec.rows.append([r["label"], r["temperature"], *[""] * 6, r["skipped"]])
            continue
        spec.rows.append([
            r["label"], r["temperature"], f"{r['median_s']:.3f}", f"{r['p95_s']:.3f}",
            f"{r['gb_per_s']:.2f}", f"{r.get('cpu_median_s', 0.0):.2f}", _gb(r["bytes"]), _check(r),
            "",
        ])  # fmt: skip
    return spec


def ratios_table(doc: dict[str, Any]) -> TableSpec:
    cols = [Column("ratio", "left"), Column("wall-clock GB/s ratio"), Column("target"),
            Column("met", "left"), Column("GB per CPU-second ratio")]  # fmt: skip
    spec = TableSpec(title="targets", columns=cols)
    for r in doc["ratios"]:
        value = "n/a" if r["value"] is None else f"{r['value']:.2f}x"
        met = {True: "yes", False: "NO", None: "-"}[r["met"]]
        cpu = r.get("cpu_value")
        cpu_text = "n/a" if cpu is None else f"{cpu:.2f}x"
        spec.rows.append([r["name"], value, f">= {r['target']:.2f}x", met, cpu_text])
    return spec


def print_report(doc: dict[str, Any], console: Console) -> None:
    for table in (results_table(doc), stages_table(doc), ratios_table(doc)):
        if table.rows:
            render_table(table, console)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m bench._load_report RESULTS.json", file=sys.stderr)
        return 2
    doc = json.loads(Path(argv[1]).read_text())
    doc["ratios"] = ratios_for(doc["rows"])  # derived from the rows; recomputed for older files
    tables = (results_table(doc), stages_table(doc), ratios_table(doc))
    print("\n\n".join(f"**{t.title}**\n\n{markdown_table(t)}" for t in tables if t.rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
