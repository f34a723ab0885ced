"""Invoke bench: warm call overhead over an in-process call, and no-op calls per second.

    python bench/invoke.py [--duration-s 10] [--clients 1,16,64] [--processes 1,2]
                           [--rate CALLS_PER_S] [--repeat N] [--broker filesystem|redis]
                           [--client lean|httpx] [--json -|PATH] [--quick]

Starts ``thaw server`` + one ``thaw worker`` (``bench._invoke_setup``), deploys
a no-op function (``__call__`` returns its input) with one warm replica, then
for each client count runs that many threads, each with its own keep-alive
connection (``--client``: ``http.client``, or httpx, which spends about ten
times the CPU per call), doing synchronous ``POST /v1/functions/noop/invoke`` calls for a
fixed duration; all of it once per server size (``--processes``: the control
plane's processes behind its port, ``THAW_SERVER_PROCESSES``), side by side.
The baseline calls the same function object in this process.
Overhead per percentile = thaw latency - in-process latency. The clients run
on the same machine as thaw, so their own CPU counts against it.

By default each client sends its next call as soon as the last one returns (a
closed loop: at saturation the latency is clients / throughput, whatever the
overhead). ``--rate R`` paces them instead: the clients together send R calls
per second, each on a fixed schedule from a random start, and a call's latency
counts from when it was due, not from when it was sent (as wrk2 does), so a
stall behind a slow call is counted, not hidden.

``--repeat N`` times every client count N times, in rounds (all client counts,
then all again), and reports each figure as the median of its N runs; the
targets are judged on those medians. One run's p99 moves by a third from one
run to the next on a shared machine.
"""

from __future__ import annotations

import argparse
import datetime as dt
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console

from bench import _cpu
from bench import _invoke_setup as setup
from bench._common import Column, TableSpec, machine_description, percentile, render_table
from bench._common import write_json as write_json_doc

DEFAULT_DURATION_S = 10.0
QUICK_DURATION_S = 3.0
DEFAULT_CLIENTS = (1, 16, 64)
QUICK_CLIENTS = (1, 4)
DEFAULT_PROCESSES = (1, 2)
QUICK_PROCESSES = (2,)
QUANTILES = (50, 95, 99)
TARGET_CLIENTS = 16
TARGET_P50_MS = 3.0
TARGET_P99_MS = 10.0
TARGET_CALLS_PER_S = 500.0
BASELINE_CALLS = 20_000
# queue_wait: accepted -> started on the replica (routing + broker); execution: the
# function; total: accepted -> result recorded by the worker.
SPLIT_KEYS = ("queue_wait", "execution", "total")
CPU_PARTS = _cpu.STACK_PARTS


@dataclass(frozen=True)
class Options:
    duration_s: float
    clients: list[int]
    processes: list[int]
    broker: str
    client: str
    json: str | None
    quick: bool
    rate: float = 0.0  # calls per second from all clients together; 0: a closed loop
    repeat: int = 1  # runs per client count; the rows are their medians


@dataclass
class ClientRun:
    """What the clients of one client count saw; filled by the client threads."""

    latencies_s: list[float] = field(default_factory=list)
    # The call's own timings (``timings_ms`` of each response): where the time went.
    server_ms: dict[str, list[float]] = field(default_factory=dict)
    failed: int = 0
    cold: int = 0
    first_error: str | None = None
    elapsed_s: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)


def parse_counts(option: str, text: str, example: str = "1,16,64") -> list[int]:
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(
            f"{option} {text!r}: give comma-separated integers, e.g. {example}"
        ) from None
    if not counts or min(counts) < 1:
        raise SystemExit(f"{option} {text!r}: every count must be at least 1")
    return counts


def parse_args(argv: list[str]) -> Options:
    p = argparse.ArgumentParser(prog="bench/invoke.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--duration-s", type=float, default=None, help="per client count (10; 3 quick)")
    p.add_argument("--clients", default=None, help="comma-separated (1,16,64; 1,4 quick)")
    p.add_argument(
        "--processes", default=None, help="server processes, comma-separated (1,2; 2 quick)"
    )
    p.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="calls per second from all clients together, paced (0: each sends when "
        "its last call returns)",
    )
    p.add_argument(
        "--repeat", type=int, default=1, help="runs per client count, reported as medians (1)"
    )
    p.add_argument("--broker", choices=setup.BROKERS, default="filesystem")
    p.add_argument("--client", choices=setup.CLIENTS, default="lean", help="HTTP client (lean)")
    p.add_argument("--json", default=None, metavar="PATH", help="write results; '-' = stdout")
    p.add_argument("--quick", action="store_true", help="short run, clients 1,4: a smoke run")
    a = p.parse_args(argv)
    if not a.rate >= 0:
        raise SystemExit(f"--rate {a.rate:g}: give calls per second, 0 or more")
    if a.repeat < 1:
        raise SystemExit(f"--repeat {a.repeat}: give the runs per client count, 1 or more")
    duration_s = a.duration_s or (QUICK_DURATION_S if a.quick else DEFAULT_DURATION_S)
    default_clients = QUICK_CLIENTS if a.quick else DEFAULT_CLIENTS
    clients = parse_counts("--clients", a.clients) if a.clients else list(default_clients)
    default_processes = QUICK_PROCESSES if a.quick else DEFAULT_PROCESSES
    processes = (
        parse_counts("--processes", a.processes, "1,2") if a.processes else list(default_processes)
    )
    return Options(
        duration_s, clients, processes, a.broker, a.client, a.json, a.quick, a.rate, a.repeat
    )


# --- measuring ----------------------------------------------------------------------
def measure_in_process(fn: Callable[[Any], Any], calls: int = BASELINE_CALLS) -> list[float]:
    """Per-call latency (s) of calling ``fn`` directly, with the same kind of input."""
    out = []
    for i in range(calls):
        started = time.perf_counter()
        fn({"i": i})
        out.append(time.perf_counter() - started)
    return out


def _client_loop(
    stack: Any, kind: str, run: ClientRun, stop_at: float, client_no: int, interval_s: float
) -> None:
    """One client: synchronous invokes on one keep-alive connection until ``stop_at``;
    with ``interval_s``, one due every ``interval_s`` from a random start, each timed
    from when it was due (0: the next as soon as the last returns)."""
    lat: list[float] = []
    server_ms: dict[str, list[float]] = {k: [] for k in SPLIT_KEYS}
    failed = cold = 0
    error: str | None = None
    url = f"/v1/functions/{setup.FUNCTION}/invoke"
    with setup.invoke_client(stack, kind) as c:
        i = 0
        due = time.perf_counter() + random.uniform(0.0, interval_s)
        while (due if interval_s else time.perf_counter()) < stop_at:
            body = {"input": {"c": client_no, "i": i}}
            if interval_s:
                time.sleep(max(0.0, due - time.perf_counter()))
            started = due if interval_s else time.perf_counter()
            due += interval_s
            try:
                r = c.post(url, json=body)
                answer = r.json() if r.status_code == 200 else {}
                ok = answer.get("output") == body["input"]
            except Exception as e:  # a failed call is counted and reported, not fatal
                ok, error = False, error or f"{type(e).__name__}: {e}"
            else:
                if not ok:
                    error = error or f"{r.status_code} {r.text[:200]}"
                elif r.headers.get("X-Thaw-Cold") != "false":
                    cold += 1
            if ok:
                lat.append(time.perf_counter() - started)
                timings = answer.get("timings_ms", {})
                for k in SPLIT_KEYS:
                    server_ms[k].append(float(timings.get(k, 0.0)))
            else:
                failed += 1
            i += 1
    with run.lock:
        run.latencies_s.extend(lat)
        for k, values in server_ms.items():
            run.server_ms.setdefault(k, []).extend(values)
        run.failed += failed
        run.cold += cold
        run.first_error = run.first_error or error


def run_clients(
    stack: Any,
    clients: int,
    duration_s: float,
    console: Console,
    kind: str = "lean",
    rate: float = 0.0,
) -> ClientRun:
    """``clients`` threads invoking for ``duration_s``, ``rate`` calls/s in all (0: each
    as fast as its calls return); progress printed once a second."""
    run = ClientRun()
    started = time.perf_counter()
    stop_at = started + duration_s
    interval_s = clients / rate if rate else 0.0
    threads = [
        threading.Thread(
            target=_client_loop, args=(stack, kind, run, stop_at, n, interval_s), daemon=True
        )
        for n in range(clients)
    ]
    for t in threads:
        t.start()
    while alive := [t for t in threads if t.is_alive()]:
        alive[0].join(timeout=1.0)  # a thread still running: a finished one returns at once
        left_s = stop_at - time.perf_counter()
        status = f"{left_s:4.0f} s left" if left_s > 0 else "finishing calls in flight"
        console.print(f"  {clients} clients: {status}", style="dim")
    for t in threads:
        t.join()
    run.elapsed_s = time.perf_counter() - started
    return run


# --- results (pure) ------------------------------------------------------------------
def quantiles_ms(latencies_s: list[float]) -> dict[str, float]:
    return {f"p{q}": percentile(latencies_s, q) * 1e3 for q in QUANTILES}


def make_row(
    clients: int,
    run: ClientRun,
    baseline_ms: dict[str, float],
    processes: int = 1,
    rate: float = 0.0,
    cpu_s: dict[str, float] | None = None,
) -> dict[str, Any]:
    """One client count's row: thaw, in-process and overhead percentiles, calls/s
    (``rate``: the calls/s the clients were paced at; 0: a closed loop), and what
    each part spent of CPU per call (``cpu_s``: CPU seconds over the run, by part)."""
    thaw_ms = quantiles_ms(run.latencies_s) if run.latencies_s else None
    overhead = {k: thaw_ms[k] - baseline_ms[k] for k in baseline_ms} if thaw_ms else None
    calls = len(run.latencies_s)
    return {
        "processes": processes,
        "clients": clients,
        "rate": rate,
        "calls": calls,
        "failed": run.failed,
        "cold": run.cold,
        "first_error": run.first_error,
        "elapsed_s": run.elapsed_s,
        "calls_per_s": calls / run.elapsed_s if run.elapsed_s > 0 else 0.0,
        "thaw_ms": thaw_ms,
        "in_process_ms": baseline_ms,
        "overhead_ms": overhead,
        "server_p50_ms": {k: percentile(v, 50) for k, v in run.server_ms.items() if v},
        "cpu_ms_per_call": (
            {part: spent * 1e3 / calls for part, spent in cpu_s.items()}
            if cpu_s is not None and calls
            else None
        ),
    }


def median_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (server size, client count), in first-run order: each figure the
    median of that pair's runs, the counts (calls, failed, cold, time) their sums."""
    groups: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault((run["processes"], run["clients"]), []).append(run)
    return [_median_row(group) for group in groups.values()]


def _median_row(group: list[dict[str, Any]]) -> dict[str, Any]:
    def by_key(name: str) -> dict[str, float] | None:
        present = [r[name] for r in group if r[name]]
        if not present:
            return None
        return {k: statistics.median(d[k] for d in present) for k in present[0]}

    return {
        **group[0],
        "runs": len(group),
        **{k: sum(r[k] for r in group) for k in ("calls", "failed", "cold", "elapsed_s")},
        "first_error": next((r["first_error"] for r in group if r["first_error"]), None),
        "calls_per_s": statistics.median(r["calls_per_s"] for r in group),
        "thaw_ms": by_key("thaw_ms"),
        "overhead_ms": by_key("overhead_ms"),
        "server_p50_ms": by_key("server_p50_ms") or {},
        "cpu_ms_per_call": by_key("cpu_ms_per_call"),
    }


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's targets and whether this run met them (``met`` None: not measured),
    each judged on the server size that came closest. Paced rows say what their
    latency is at their rate, not how many calls thaw can take: no throughput."""
    at16 = min(
        (r for r in rows if r["clients"] == TARGET_CLIENTS and r["overhead_ms"]),
        key=lambda r: r["overhead_ms"]["p50"],
        default=None,
    )
    closed = [r["calls_per_s"] for r in rows if not r.get("rate")]
    best = max(closed, default=None)
    how = _pacing(at16.get("rate", 0.0) if at16 else 0.0)

    def check(name: str, value: float | None, limit: float, upper: bool) -> dict[str, Any]:
        met = None if value is None else (value <= limit if upper else value >= limit)
        bound = "<=" if upper else ">="
        return {"name": name, "target": f"{bound} {limit:g}", "value": value, "met": met}

    p50 = at16["overhead_ms"]["p50"] if at16 else None
    p99 = at16["overhead_ms"]["p99"] if at16 else None
    return [
        check(f"overhead p50 ms at {TARGET_CLIENTS} clients, {how}", p50, TARGET_P50_MS, True),
        check(f"overhead p99 ms at {TARGET_CLIENTS} clients, {how}", p99, TARGET_P99_MS, True),
        check("no-op calls per second (best closed-loop row)", best, TARGET_CALLS_PER_S, False),
    ]


def results_table(doc: dict[str, Any]) -> TableSpec:
    cols = ["procs", "clients", "calls", "failed", "calls/s", "+p50", "+p95", "+p99"]
    cols += ["thaw p50"]
    cols += ["queue_wait p50", "worker total p50", "in-proc p50"]
    spec = TableSpec(
        title=(
            f"thaw warm invoke: overhead (+) over in-process, ms ({doc['broker']} broker, "
            f"{doc.get('client', 'httpx')} client, {_pacing(doc.get('rate', 0.0))})"
        ),
        columns=[Column(c) for c in cols],
        caption=(
            f"{doc['duration_s']:g} s per client count{_runs(doc)}; "
            f"{doc['machine']['cpus']} CPUs; "
            "procs = the server's processes; "
            "queue_wait = accepted -> started on the replica, worker total = accepted -> "
            "result at the worker (the calls' own timings)"
        ),
    )
    for r in doc["rows"]:
        o, t = r["overhead_ms"] or {}, r["thaw_ms"] or {}
        ms = [f"{o[k]:.2f}" if o else "-" for k in ("p50", "p95", "p99")]
        counts = [str(r[k]) for k in ("processes", "clients", "calls", "failed")]
        thaw_p50 = f"{t['p50']:.2f}" if t else "-"
        split = [f"{r['server_p50_ms'].get(k, 0.0):.2f}" for k in ("queue_wait", "total")]
        in_proc = f"{r['in_process_ms']['p50'] * 1e3:.1f} µs"
        spec.rows.append([*counts, f"{r['calls_per_s']:.0f}", *ms, thaw_p50, *split, in_proc])
    return spec


def cpu_table(doc: dict[str, Any]) -> TableSpec | None:
    """CPU ms per call by part; None when no row measured it (no ``/proc``)."""
    rows = [r for r in doc["rows"] if r.get("cpu_ms_per_call")]
    if not rows:
        return None
    cols = [Column(c) for c in ("procs", "clients", *CPU_PARTS, "thaw in all")]
    spec = TableSpec(
        "CPU per call, ms (user + system, all threads)",
        cols,
        caption=(
            "server = its processes; worker = the worker agent; replica = its zygote and "
            "replica processes; clients = this bench's client threads. Where calls/s moves "
            "with other tenants' load (steal time), these move less"
        ),
    )
    for r in rows:
        cpu = r["cpu_ms_per_call"]
        thaw = sum(cpu[p] for p in CPU_PARTS if p != "clients")
        figures = [f"{cpu[p]:.2f}" for p in CPU_PARTS]
        spec.rows.append([str(r["processes"]), str(r["clients"]), *figures, f"{thaw:.2f}"])
    return spec


def _runs(doc: dict[str, Any]) -> str:
    repeat = doc.get("repeat", 1)
    return f", {repeat} runs each, medians" if repeat > 1 else ""


def _pacing(rate: float) -> str:
    return f"paced at {rate:g} calls/s" if rate else "closed loop"


def targets_table(doc: dict[str, Any]) -> TableSpec:
    spec = TableSpec("targets", [Column("target", "left"), Column("bound"), Column("value")])
    spec.columns.append(Column("met"))
    for t in doc["targets"]:
        value = "-" if t["value"] is None else f"{t['value']:.2f}"
        met = {True: "yes", False: "NO", None: "not measured"}[t["met"]]
        spec.rows.append([t["name"], t["target"], value, met])
    return spec


def cpu_meter(stack: Any) -> _cpu.TreeMeter | None:
    """A meter of the stack's parts (``CPU_PARTS``); None without ``/proc``."""
    groups = _cpu.stack_groups(stack)
    return None if groups is None else _cpu.TreeMeter(groups)


# --- main ----------------------------------------------------------------------------
def _rounds(opts: Options) -> list[tuple[int, int]]:
    """(round, client count) in the order they run: every client count, then again."""
    return [(r, clients) for r in range(opts.repeat) for clients in opts.clients]


def run_bench(opts: Options, console: Console) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="thaw-bench-invoke-") as tmp_name:
        tmp = Path(tmp_name)
        bundle_dir = setup.write_bundle(tmp / "bundle")
        baseline_ms = quantiles_ms(measure_in_process(setup.load_in_process(bundle_dir)))
        bundle = setup.push_bundle(bundle_dir, tmp / "store")
        runs = []
        for processes in opts.processes:
            console.print(f"starting thaw: {processes} server process(es), {opts.broker} broker")
            root = tmp / f"p{processes}"
            with setup.running(root, opts.broker, tmp / "store", processes) as stack:
                stack.deploy(setup.function_spec(bundle, max(opts.clients)))
                setup.warm_up(stack)
                for round_no, clients in _rounds(opts):
                    console.print(
                        f"{clients} clients for {opts.duration_s:g} s"
                        + (f" (run {round_no + 1}/{opts.repeat})" if opts.repeat > 1 else "")
                    )
                    meter = cpu_meter(stack)
                    run = run_clients(
                        stack, clients, opts.duration_s, console, opts.client, opts.rate
                    )
                    cpu = meter.spent_s() if meter is not None else None
                    runs.append(make_row(clients, run, baseline_ms, processes, opts.rate, cpu))
    rows = median_rows(runs)
    return {
        "bench": "invoke",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "broker": opts.broker,
        "client": opts.client,
        "duration_s": opts.duration_s,
        "rate": opts.rate,
        "repeat": opts.repeat,
        "clients": opts.clients,
        "processes": opts.processes,
        "rows": rows,
        "runs": runs,
        "targets": targets(rows),
        "machine": machine_description(),
    }


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(sys.argv[1:] if argv is None else argv)
    # Progress and tables go to stderr when the JSON goes to stdout.
    console = Console(stderr=opts.json == "-", width=max(Console().width, 110))
    try:
        doc = run_bench(opts, console)
    except setup.SetupError as e:
        console.print(f"[red]invoke bench: {e}[/red]")
        return 2
    render_table(results_table(doc), console)
    if (cpu := cpu_table(doc)) is not None:
        render_table(cpu, console)
    render_table(targets_table(doc), console)
    if opts.json:
        write_json_doc(doc, opts.json)
    return 0 if all(r["failed"] == 0 and r["calls"] > 0 for r in doc["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
