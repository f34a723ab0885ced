"""Helpers any thaw benchmark can share: fresh-process trials, statistics, output.

A trial runs in a fresh Python process so no state (allocator caches, page
tables, imported modules, open files, thread pools) carries from one trial to
the next. The protocol between the parent and a trial process is one line::

    parent:  python -m <module> '<spec JSON>'
    child:   ... any output ...
             BENCH_RESULT {"load_s": ..., ...}     # last such line wins

A child that exits non-zero, or prints no result line, fails the trial; the
parent raises ``TrialError`` with the tail of the child's stderr.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO, TypeVar

# Shared with the thaw commands that measure (thaw loadtest); re-exported here.
from cli.report import Column as Column
from cli.report import TableSpec as TableSpec
from cli.report import percentile as percentile
from cli.report import render_table as render_table

T = TypeVar("T")
RESULT_PREFIX = "BENCH_RESULT "
REPO_ROOT = Path(__file__).resolve().parents[1]
BYTES_PER_GB = 1e9
# The end-to-end tests' Stack shortens every interval (heartbeat 0.5 s, a worker
# lost after 2 s, a reconcile tick every 0.1 s) to make tests quick; under a
# saturating load that loses the worker, and the ticks alone cost the server five
# times their CPU. The benches that time thaw's overhead run with the production
# defaults (control_plane/settings.py).
PRODUCTION_ENV = {
    "THAW_HEARTBEAT_INTERVAL_S": "5",
    "THAW_WORKER_LOST_AFTER_HEARTBEATS": "3",
    "THAW_RECONCILE_INTERVAL_S": "0.5",
    "THAW_RESULT_POLL_INTERVAL_S": "0.25",
    "THAW_BROKER_POLL_INTERVAL_S": "0.02",
}


class TrialError(RuntimeError):
    """A trial process failed; the message carries its exit status and stderr tail."""


@dataclass(frozen=True)
class TrialOutcome:
    """What one fresh-process trial reported, plus what the parent measured."""

    result: dict[str, Any]
    process_s: float  # the whole child: interpreter start, imports, load, exit


def emit_result(result: dict[str, Any], stream: TextIO | None = None) -> None:
    """Child side: print the one result line the parent looks for."""
    out = stream or sys.stdout
    out.write(RESULT_PREFIX + json.dumps(result) + "\n")
    out.flush()


def parse_result(stdout: str) -> dict[str, Any] | None:
    """The last result line of a child's stdout, or None when there is none."""
    found: dict[str, Any] | None = None
    for line in stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            found = json.loads(line[len(RESULT_PREFIX) :])
    return found


def run_fresh_process(
    module: str,
    spec: dict[str, Any],
    *,
    timeout_s: float = 900.0,
    env: dict[str, str] | None = None,
) -> TrialOutcome:
    """Run ``python -m module SPEC`` from the repository root; return its result.

    Raises ``TrialError`` when the child fails or reports nothing.
    """
    child_env = dict(os.environ)
    child_env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT), *filter(None, [child_env.get("PYTHONPATH")])]
    )
    child_env.update(env or {})
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", module, json.dumps(spec)],
        cwd=REPO_ROOT,
        env=child_env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    process_s = time.perf_counter() - started
    result = parse_result(proc.stdout)
    if proc.returncode != 0 or result is None:
        tail = (proc.stderr or proc.stdout)[-3000:]
        raise TrialError(
            f"trial {spec.get('method', '?')} exited with status {proc.returncode} "
            f"and {'a' if result else 'no'} result; its output ends with:\n{tail}"
        )
    return TrialOutcome(result=result, process_s=process_s)


@dataclass(frozen=True)
class Summary:
    """Order statistics of one row's trial times (seconds)."""

    n: int
    median_s: float
    p95_s: float
    min_s: float
    max_s: float


def summarize(times_s: Sequence[float]) -> Summary:
    return Summary(
        n=len(times_s),
        median_s=statistics.median(times_s),
        p95_s=percentile(times_s, 95),
        min_s=min(times_s),
        max_s=max(times_s),
    )


def median_phases(phases: Sequence[dict[str, float]]) -> dict[str, float]:
    """Each phase's median over samples (a sample without it counts 0), in the order
    the phases first appear."""
    names = dict.fromkeys(k for p in phases for k in p)
    return {k: statistics.median(p.get(k, 0.0) for p in phases) for k in names}


def gb_per_s(n_bytes: int, seconds: float) -> float:
    """Decimal gigabytes (1e9 bytes) per second; 0 for a zero time."""
    return n_bytes / seconds / BYTES_PER_GB if seconds > 0 else 0.0


def round_robin_order(rows: Sequence[T], trial: int) -> list[T]:
    """The order rows run in for trial ``trial``: all rows, rotated by the trial index.

    Every trial runs every row once (interleaved, never all trials of one row
    in a row); rotating the start spreads any drift (thermal, other tenants,
    a filling disk) over all rows instead of always hitting the same one.
    """
    if not rows:
        return []
    k = trial % len(rows)
    return [*rows[k:], *rows[:k]]


def markdown_table(spec: TableSpec) -> str:
    """The same table as GitHub markdown (for README files)."""
    lines = [
        "| " + " | ".join(c.header for c in spec.columns) + " |",
        "| " + " | ".join("---:" if c.justify == "right" else "---" for c in spec.columns) + " |",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in spec.rows]
    return "\n".join(lines)


def write_json(doc: dict[str, Any], target: str) -> None:
    """Write ``doc`` to ``target`` (a path), or as one object to stdout for ``-``."""
    text = json.dumps(doc, indent=2, sort_keys=True)
    if target == "-":
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
        return
    path = Path(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text + "\n")
    tmp.replace(path)


def files_under(paths: Iterable[Path]) -> list[Path]:
    """Every regular file at or under the given paths (missing paths are skipped)."""
    out: list[Path] = []
    for p in paths:
        if p.is_file():
            out.append(p)
        elif p.is_dir():
            out.extend(sorted(q for q in p.rglob("*") if q.is_file()))
    return out


def no_cuda() -> str | None:
    """Why models cannot run on CUDA here, or None when they can."""
    import torch

    if not torch.cuda.is_available():
        return "torch sees no CUDA device on this machine"
    return None


def machine_description() -> dict[str, Any]:
    """What the numbers were measured on."""
    import platform

    import torch

    cuda = torch.cuda.is_available()
    return {
        "cpus": os.cpu_count(),
        "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
    }
