"""RAM-tier bench: how soon a replica's weights are ready from the tier, and what a second
replica of the same model adds to the worker's memory (#29 item 2).

    python bench/ram_tier.py [--size-mb 1024] [--trials 5] [--json -|PATH]
                             [--data-dir bench/.data]

The model is the loader bench's (``bench._model``, generated once into
``--data-dir``), pushed to a thaw store there; a host-RAM tier on ``/dev/shm``
is filled by one load in setup and removed at the end.

A trial of a row is two replicas, each a fresh process (``python -m bench.ram_tier
SPEC``) that loads the model and holds it: replica A loads; then replica B
imports, waits, loads while A still holds its tensors. Each reports:

- ``ready_s``: ``Snapshotter.load`` (the weights usable as tensors);
- ``touch_s``: then reading one byte of every 4 KiB page of every tensor: the
  page faults a first forward pass would otherwise take (0 if ``ready`` populated);
- the proportional set size (``Pss`` of ``/proc/PID/smaps_rollup``).

``added`` is what B's load added to the two processes' PSS together:
``(A after B's load + B after) - (A before B's load + B before)``, both
"before"s read once B has imported everything, so shared libraries do not blur
it. Pages the two share count half to each, so a load that shares the tier's
pages adds ~0 and one that copies adds the weights' bytes.

Rows: the tier with ``verify`` on and off, and the disk cache without a tier,
its entries mapped (the page cache's pages, shared like the tier's) and with
mapping off (``THAW_LOADER_MAP_CACHE=0``: each replica its own copy, the
alternative).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console

from bench._common import (
    BYTES_PER_GB,
    REPO_ROOT,
    Column,
    TableSpec,
    emit_result,
    machine_description,
    parse_result,
    render_table,
    round_robin_order,
    run_fresh_process,
    write_json,
)

DEFAULT_SIZE_MB = 1024
PAGE_BYTES = 4096
ROWS = {
    "tier-verify": "thaw RAM tier, verify on",
    "tier-noverify": "thaw RAM tier, verify off",
    "cache": "thaw disk cache, no tier, mapped",
    "cache-copy": "thaw disk cache, no tier, mapping off (a copy each)",
}


# --- a replica (the child) ----------------------------------------------------------


def pss_bytes(pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no Pss line in /proc/{pid}/smaps_rollup")


def _touch_pages(tensors: dict[str, Any]) -> int:
    """Read one byte of every page of every tensor; returns a sum so nothing is skipped."""
    import torch

    acc = 0
    for t in tensors.values():
        flat = t.detach().reshape(-1).view(torch.uint8)
        acc += int(flat[::PAGE_BYTES].sum())
    return acc


def replica(spec: dict[str, Any]) -> None:
    """Load as ``spec`` says, report, and hold the tensors until stdin closes."""
    from bench._thaw import BENCH_REF
    from snapshotter.cache import DiskCache
    from snapshotter.config import CacheConfig, LoaderConfig, RamTierConfig
    from snapshotter.loader import Snapshotter
    from snapshotter.ram_tier import RamTier

    tier = None
    if spec["tier"]:
        config = RamTierConfig(Path(spec["tier"]), max_bytes=64 << 30, verify=spec["verify"])
        tier = RamTier(config)
    cache = DiskCache(CacheConfig(directory=Path(spec["cache_dir"])))
    loader = LoaderConfig(map_cache=spec.get("map_cache", True))
    snap = Snapshotter(_registry(spec["store"]), cache, loader, ram_tier=tier)
    emit_result({"phase": "imported", "pss_bytes": pss_bytes()})
    sys.stdout.flush()
    sys.stdin.readline()  # the parent's go
    start = time.perf_counter()
    tensors = snap.load(BENCH_REF)
    ready_s = time.perf_counter() - start
    start = time.perf_counter()
    _touch_pages(tensors)
    touch_s = time.perf_counter() - start
    emit_result(
        {
            "phase": "loaded",
            "ready_s": ready_s,
            "touch_s": touch_s,
            "pss_bytes": pss_bytes(),
            "tensor_bytes": tensors.report.tensor_bytes,
            "ram_tier_bytes": tensors.report.ram_tier_bytes,
        }
    )
    sys.stdout.flush()
    sys.stdin.readline()  # hold until the parent is done measuring


def _registry(store_dir: str) -> Any:
    from snapshotter.registry import Registry
    from snapshotter.stores.local import LocalStore

    return Registry(LocalStore(Path(store_dir)))


# --- the parent ---------------------------------------------------------------------


class Replica:
    """A replica process driven line by line over its stdin and stdout."""

    def __init__(self, spec: dict[str, Any]) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.ram_tier", json.dumps(spec)],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def next_result(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            found = parse_result(line)
            if found is not None:
                return found
        raise RuntimeError(f"replica exited ({self.proc.wait()}) without a result")

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        """Let the replica exit (its stdin closes) and wait for it."""
        self.proc.communicate(timeout=60)


def trial(spec: dict[str, Any]) -> dict[str, Any]:
    """Replica A loads; replica B loads while A holds; what B added to the pair's PSS."""
    a, b = Replica(spec), Replica(spec)
    try:
        a.next_result()
        a.go()
        loaded_a = a.next_result()
        imported_b = b.next_result()
        pss_a_before = pss_bytes(a.proc.pid)
        b.go()
        loaded_b = b.next_result()
        pss_a_after = pss_bytes(a.proc.pid)
    finally:
        a.close()
        b.close()
    added = pss_a_after + loaded_b["pss_bytes"] - pss_a_before - imported_b["pss_bytes"]
    return {
        "ready_s": [loaded_a["ready_s"], loaded_b["ready_s"]],
        "touch_s": [loaded_a["touch_s"], loaded_b["touch_s"]],
        "tensor_bytes": loaded_b["tensor_bytes"],
        "ram_tier_bytes": loaded_b["ram_tier_bytes"],
        "second_added_pss_bytes": added,
    }


def setup(data_dir: Path, size_mb: int, console: Console) -> tuple[dict[str, Any], Path]:
    """(a replica spec without row settings, the tier directory): model, store, filled tier."""
    from bench._model import ensure_model
    from bench._thaw import push_model

    data_dir.mkdir(parents=True, exist_ok=True)
    console.log(f"model: {size_mb} MiB of bf16 Llama-shaped shards under {data_dir}")
    model = ensure_model(data_dir, size_mb)
    store = data_dir / "thaw-store"
    push_model(model.directory, {"url": str(store), "endpoint_url": None})
    cache = data_dir / f"thaw-cache-{model.checksum:016x}"
    shm = Path("/dev/shm")
    tier = (shm if shm.is_dir() else data_dir) / f"thaw-bench-ram-{os.getpid()}"
    base = {"store": str(store), "cache_dir": str(cache), "tier": str(tier), "verify": True}
    console.log("filling the disk cache and the RAM tier")
    run_fresh_process("bench._load_methods", _fill_spec(base, model.checksum))
    return base, tier


def _fill_spec(base: dict[str, Any], checksum: int) -> dict[str, Any]:
    store = {"url": base["store"], "endpoint_url": None}
    return {
        "method": "thaw",
        "store": store,
        "cache_dir": base["cache_dir"],
        "device": "cpu",
        "expected_checksum": checksum,
        "ram_tier_dir": base["tier"],
    }


def row_spec(base: dict[str, Any], row: str) -> dict[str, Any]:
    if row == "cache":
        return {**base, "tier": None}
    if row == "cache-copy":
        return {**base, "tier": None, "map_cache": False}
    return {**base, "verify": row == "tier-verify"}


def run(base: dict[str, Any], trials: int, console: Console) -> dict[str, list[dict[str, Any]]]:
    seen: dict[str, list[dict[str, Any]]] = {r: [] for r in ROWS}
    for t in range(trials):
        for row in round_robin_order(list(ROWS), t):
            console.print(f"trial {t + 1}/{trials}: {ROWS[row]}", style="dim")
            seen[row].append(trial(row_spec(base, row)))
    return seen


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    gb = records[0]["tensor_bytes"] / BYTES_PER_GB
    ready = statistics.median(s for r in records for s in r["ready_s"])
    touch = statistics.median(s for r in records for s in r["touch_s"])
    added = statistics.median(r["second_added_pss_bytes"] for r in records)
    return {
        "gb": gb,
        "ready_s": ready,
        "ready_s_per_gb": ready / gb,
        "touch_s_per_gb": touch / gb,
        "from_tier": all(r["ram_tier_bytes"] == r["tensor_bytes"] for r in records),
        "second_added_pss_bytes": added,
        "second_added_pct": 100 * added / records[0]["tensor_bytes"],
    }


def table(summary: dict[str, dict[str, Any]], trials: int) -> TableSpec:
    spec = TableSpec(
        title=f"RAM tier: ready and shared ({trials} trials x 2 replicas, medians)",
        columns=[
            Column("row", "left"),
            Column("GB"),
            Column("ready s"),
            Column("ready s/GB"),
            Column("first touch s/GB"),
            Column("2nd replica adds MB"),
            Column("% of weights"),
        ],
        caption="first touch = one byte per 4 KiB page after ready (faults a forward pass "
        "would take); adds = PSS the second replica's load added to the two processes",
    )
    for row, s in summary.items():
        spec.rows.append(
            [
                ROWS[row],
                f"{s['gb']:.2f}",
                f"{s['ready_s']:.3f}",
                f"{s['ready_s_per_gb']:.3f}",
                f"{s['touch_s_per_gb']:.3f}",
                f"{s['second_added_pss_bytes'] / 1e6:.1f}",
                f"{s['second_added_pct']:.1f}%",
            ]
        )
    return spec


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 1 and argv[0].startswith("{"):  # a replica
        replica(json.loads(argv[0]))
        return 0
    p = argparse.ArgumentParser(prog="bench/ram_tier.py", description=__doc__.splitlines()[0])
    p.add_argument("--size-mb", type=int, default=DEFAULT_SIZE_MB, help="model size (1024)")
    p.add_argument("--trials", type=int, default=5, help="trials per row (5)")
    p.add_argument("--json", help="write the results as JSON to PATH, or - for stdout")
    p.add_argument("--data-dir", type=Path, default=Path(__file__).resolve().parent / ".data")
    args = p.parse_args(argv)
    if args.trials < 1:
        p.error("--trials must be at least 1")
    console = Console(stderr=args.json == "-")
    base, tier = setup(args.data_dir, args.size_mb, console)
    try:
        records = run(base, args.trials, console)
    finally:
        shutil.rmtree(tier, ignore_errors=True)
    summary = {row: summarize(recs) for row, recs in records.items()}
    render_table(table(summary, args.trials), console)
    if args.json:
        machine = machine_description()
        write_json({"machine": machine, "trials": args.trials, "rows": summary,
                    "records": records}, args.json)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
