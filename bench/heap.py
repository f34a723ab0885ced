"""Heap bench: what freezing a process's start-up objects (``control_plane.heap``) saves.

    python bench/heap.py [--trials 5] [--json -|PATH]

Two of thaw's processes, each measured with its start-up objects frozen and
not, in one run, the two alternating trial by trial. Each trial is a fresh
interpreter (``python -m bench.heap SPEC``) that first builds what the real
process holds, then runs one full collection (``gc.collect()``), as Python does
on its own once enough objects have outlived two younger collections:

- ``replica``: the worker's zygote (``worker.replica_child.import_libraries``
  with the default ``THAW_WORKER_POOL_PRELOAD``: torch, transformers, peft),
  then a fork, the way a replica starts. The fork collects; reported: the
  pause, and the private memory the collection cost it (the zygote's pages it
  wrote to, copied on write; ``Private_Dirty`` in ``/proc/self/smaps_rollup``).
- ``server``: a control plane process (``create_app`` on an empty SQLite
  installation, the reconcile loop not started). Reported: the pause, which
  every call in flight in that process waits out (the collection holds the GIL).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import (
    Column,
    TableSpec,
    emit_result,
    render_table,
    round_robin_order,
    run_fresh_process,
    write_json,
)
from control_plane import heap

PROCESSES = ("replica", "server")
ARMS = ("as is", "frozen")


# --- one trial (a fresh interpreter) ----------------------------------------------------


def _collect() -> dict[str, Any]:
    """One full collection, measured from inside the process that runs it."""
    before_kib = heap.private_dirty_kib()
    t0 = time.perf_counter()
    gc.collect()
    pause_ms = (time.perf_counter() - t0) * 1000
    return {
        "pause_ms": pause_ms,
        "copied_mib": (heap.private_dirty_kib() - before_kib) / 1024,
        "tracked": len(gc.get_objects()),
        "frozen": gc.get_freeze_count(),
    }


def _build(process: str, home: str) -> None:
    from control_plane.settings import Settings

    if process == "replica":
        from worker.replica_child import import_libraries

        preload = Settings.model_fields["worker_pool_preload"].default
        import_libraries(tuple(m for m in preload.split(",") if m))
        return
    from control_plane.api.app import create_app

    create_app(Settings(home=Path(home)), run_loop=False)


def _in_a_fork() -> dict[str, Any]:
    """``_collect`` in a child forked now; its result comes back through a pipe."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        with os.fdopen(w, "w") as out:
            out.write(json.dumps(_collect()))
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as src:
        result: dict[str, Any] = json.loads(src.read())
    os.waitpid(pid, 0)
    return result


def trial(spec: dict[str, Any]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="thaw-heap-bench-") as home:
        _build(spec["process"], home)
        if spec["arm"] == "frozen":
            heap.freeze()
        return _in_a_fork() if spec["process"] == "replica" else _collect()


# --- the parent ------------------------------------------------------------------------


def run(trials: int, console: Console) -> list[dict[str, Any]]:
    """Every (process, arm) ``trials`` times, interleaved; one row per pair, medians."""
    pairs = [(p, a) for p in PROCESSES for a in ARMS]
    seen: dict[tuple[str, str], list[dict[str, Any]]] = {pair: [] for pair in pairs}
    for t in range(trials):
        for process, arm in round_robin_order(pairs, t):
            console.print(f"trial {t + 1}/{trials}: {process}, {arm}", style="dim")
            outcome = run_fresh_process("bench.heap", {"process": process, "arm": arm})
            seen[(process, arm)].append(outcome.result)
    return [_row(process, arm, seen[(process, arm)]) for process, arm in pairs]


def _row(process: str, arm: str, results: list[dict[str, Any]]) -> dict[str, Any]:
    medians = {k: statistics.median(r[k] for r in results) for k in results[0]}
    counts = {k: int(medians[k]) for k in ("tracked", "frozen")}
    return {"process": process, "arm": arm, "trials": len(results), **medians, **counts}


def table(rows: list[dict[str, Any]]) -> TableSpec:
    as_is = {r["process"]: r for r in rows if r["arm"] == "as is"}
    spec = TableSpec(
        title="one full collection, with the start-up objects frozen and not (medians)",
        columns=[
            Column("process", "left"),
            Column("start-up objects", "left"),
            Column("objects visited"),
            Column("frozen"),
            Column("pause ms"),
            Column("shorter"),
            Column("copied MiB"),
        ],
        caption=(
            "shorter = the as-is pause over this one; "
            "copied = private memory the collection cost a fork of the zygote"
        ),
    )
    for r in rows:
        shorter = as_is[r["process"]]["pause_ms"] / max(r["pause_ms"], 0.001)
        ratio = f"{shorter:,.0f}x" if shorter >= 10 else f"{shorter:.1f}x"
        copied = f"{r['copied_mib']:.1f}" if r["process"] == "replica" else "-"
        spec.rows.append(
            [
                r["process"],
                r["arm"],
                f"{r['tracked']:,}",
                f"{r['frozen']:,}",
                f"{r['pause_ms']:.2f}",
                ratio,
                copied,
            ]
        )
    return spec


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 1 and argv[0].startswith("{"):  # a trial's child
        emit_result(trial(json.loads(argv[0])))
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=5, help="per process and arm (5)")
    p.add_argument("--json", help="write the rows as JSON to PATH, or - for stdout")
    args = p.parse_args(argv)
    if args.trials < 1:
        p.error("--trials must be at least 1")
    console = Console(stderr=args.json == "-")
    rows = run(args.trials, console)
    render_table(table(rows), console)
    if args.json:
        write_json({"trials": args.trials, "rows": rows}, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
