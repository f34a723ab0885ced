"""Cold-start benchmark: thaw's cold, warm and adapter paths against a naive load, in one run.

    python bench/coldstart.py [--trials 5] [--quick] [--json] [--png PATH] [--data-dir DIR]
    python bench/coldstart.py --model DIR [--adapter DIR ...] [--trials 5] [--keep] [--json]

With ``--model`` the table is for that Hugging Face model directory and its PEFT
adapters instead of the example: ``bench._coldstart_model``. Without it:

thaw runs as real processes (``thaw server`` + ``thaw worker``, SQLite and the
filesystem broker) in four installations, all up for the whole run:

- ``pool``:  local store, ``THAW_WORKER_POOL_SIZE=1``   → pool hit rows, warm, adapters, trace
- ``nopool``: local store, ``THAW_WORKER_POOL_SIZE=0``  → pool miss row (a fork of the zygote)
- ``spawn``: as ``nopool`` with ``THAW_WORKER_POOL_ZYGOTE=0`` → pool miss, new interpreter
- ``s3``:    moto S3 store on loopback, pool of 1, a fresh worker (empty disk cache)
             before every trial → S3-only row

The host-RAM tier is off everywhere, so the "disk cache" rows read the disk
cache. Cold starts come from scaling to zero (a 1 s idle timeout) and then
invoking; every trial of every row is interleaved round-robin, and the naive
and boto3 rows are fresh processes (``bench._coldstart_trials``). How to read
the results: ``bench/README.md``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from bench import _coldstart_report as report
from bench import _coldstart_scenarios as sc
from bench import _coldstart_setup as setup
from bench._common import (
    machine_description,
    no_cuda,
    render_table,
    round_robin_order,
    run_fresh_process,
    write_json,
)
from bench._load_setup import moto_server

TRIAL_MODULE = "bench._coldstart_trials"
COLD_FN = "textgen"
WARM_FN = "textgen-warm"
COLD_IDLE_TIMEOUT_S = 1.0
TRACE_IDLE_TIMEOUT_S = 2.0
COLD_ROWS = (
    "naive",
    "thaw_pool_hit",
    "thaw_pool_miss",
    "thaw_pool_miss_spawn",
    "boto3_s3",
    "thaw_s3",
)
MISS_ROWS = ("thaw_pool_miss", "thaw_pool_miss_spawn")
POOL_RETRIES = 3
NO_RAM_TIER = {"THAW_RAM_TIER_MAX_BYTES": "0"}


@dataclass(frozen=True)
class Options:
    trials: int
    quick: bool
    json: bool
    png: Path
    data_dir: Path
    model: Path | None = None
    adapters: tuple[Path, ...] = ()
    keep: bool = False
    device: str = "cpu"

    @property
    def warm_calls(self) -> int:
        return 5 if self.quick else 50

    @property
    def switch_pairs(self) -> int:
        return 3 if self.quick else 50

    @property
    def pool_refill_s(self) -> float:
        return 8.0  # a generic process imports torch: a few seconds on 2 busy cores

    @property
    def trace(self) -> sc.TraceShape:
        bursts, calls = (2, 2) if self.quick else (6, 4)
        return sc.TraceShape(
            bursts, calls, arrival_gap_s=0.05, idle_gap_s=2 * TRACE_IDLE_TIMEOUT_S + 1
        )


def parse_args(argv: list[str]) -> Options:
    p = argparse.ArgumentParser(prog="bench/coldstart.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=None, help="cold trials per row (5; 1 quick)")
    p.add_argument("--quick", action="store_true", help="tiny model, one trial: a smoke run")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    p.add_argument("--png", type=Path, default=None, help="chart path (<data-dir>/coldstart.png)")
    p.add_argument("--data-dir", type=Path, default=Path(__file__).resolve().parent / ".data")
    p.add_argument("--model", type=Path, default=None, help="a Hugging Face model directory")
    p.add_argument("--adapter", type=Path, action="append", default=[], help="a PEFT adapter")
    p.add_argument("--keep", action="store_true", help="keep the --model run's scratch store")
    p.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="with --model: where it runs"
    )
    a = p.parse_args(argv)
    trials = a.trials if a.trials is not None else (1 if a.quick else 5)
    if trials < 1:
        p.error("--trials must be at least 1")
    if a.model is None and (a.adapter or a.keep):
        p.error("--adapter and --keep go with --model")
    if a.model is None and a.device != "cpu":
        p.error("--device goes with --model (the example's run is on the CPU)")
    if a.device == "cuda" and (why := no_cuda()) is not None:
        p.error(f"--device cuda: {why}")
    if a.model is not None and (a.quick or a.png):
        p.error("--model measures that model: --quick and --png are for the example's run")
    png = a.png or a.data_dir / "coldstart.png"
    model = (a.model, tuple(a.adapter), a.keep, a.device)
    return Options(trials, a.quick, a.json, png, a.data_dir, *model)


@dataclass
class Env:
    """Everything setup made, shared by every trial."""

    dirs: dict[str, Path]
    scratch: Path
    raw_s3: dict[str, Any]
    pool: setup.BenchStack
    nopool: setup.BenchStack
    spawn: setup.BenchStack
    s3: setup.BenchStack
    s3_workers: int = 1
    pool_refill_misses: dict[str, int] = field(default_factory=dict)


def _start(
    stack_ctx: ExitStack, scratch: Path, name: str, store: str, env: dict[str, str]
) -> setup.BenchStack:
    worker_env = {**NO_RAM_TIER, "THAW_CACHE_DIR": str(scratch / name / "cache-1"), **env}
    return stack_ctx.enter_context(setup.running(scratch / name, store, worker_env))


@contextmanager
def environment(opts: Options, say: Callable[[str], None]) -> Iterator[Env]:
    size = setup.QUICK_MODEL if opts.quick else setup.FULL_MODEL
    say(f"building the example model ({size.tag}) unless cached")
    dirs = setup.ensure_example(opts.data_dir, size)
    with ExitStack() as ctx:
        scratch = setup.scratch_dir(opts.data_dir)
        ctx.callback(_remove_tree, scratch)  # first in, last out: after the stacks stop
        endpoint = ctx.enter_context(moto_server())
        say("pushing model, adapters and bundle to a local store and to S3")
        local_store = str(scratch / "store")
        bundle = setup.push_example(dirs, local_store, None)
        s3_store = setup.create_thaw_bucket(endpoint)
        setup.push_example(dirs, s3_store, endpoint)
        raw = setup.upload_raw(endpoint, dirs["model"])
        say("starting four thaw installations (server + worker each)")
        pool = _start(ctx, scratch, "pool", local_store, {"THAW_WORKER_POOL_SIZE": "1"})
        nopool = _start(ctx, scratch, "nopool", local_store, {"THAW_WORKER_POOL_SIZE": "0"})
        no_zygote = {"THAW_WORKER_POOL_SIZE": "0", "THAW_WORKER_POOL_ZYGOTE": "0"}
        spawn = _start(ctx, scratch, "spawn", local_store, no_zygote)
        s3_env = {"THAW_WORKER_POOL_SIZE": "1", **setup.s3_env(endpoint)}
        s3 = _start(ctx, scratch, "s3", s3_store, s3_env)
        for stack in (pool, nopool, spawn, s3):
            stack.deploy(
                setup.function_spec(
                    bundle, COLD_FN, min_replicas=0, idle_timeout_s=COLD_IDLE_TIMEOUT_S
                )
            )
        pool.deploy(setup.function_spec(bundle, WARM_FN, min_replicas=0, idle_timeout_s=3600))
        env = Env(dirs, scratch, raw, pool, nopool, spawn, s3)
        say("priming the disk caches (one untimed cold start each)")
        for stack in (pool, nopool, spawn):
            sc.timed_call(stack, COLD_FN)
        _settle(env, opts)
        yield env


def _remove_tree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def _settle(env: Env, opts: Options) -> None:
    """Every installation scaled to zero with a full pool: nothing runs during a trial."""
    for stack in (env.pool, env.nopool, env.spawn, env.s3):
        stack.wait_scaled_to_zero(COLD_FN)
    env.pool.wait_pool_ready(opts.pool_refill_s)


def _fresh_s3_worker(env: Env, opts: Options) -> None:
    """Replace the S3 installation's worker by one with an empty disk cache."""
    stack = env.s3
    old = stack.procs.pop()  # the worker: started after the server
    old_ids = {w["id"] for w in stack.workers() if not w["lost"]}
    old.stop()
    sc_wait = time.monotonic() + 120
    while any(w["id"] in old_ids and not w["lost"] for w in stack.workers()):
        if time.monotonic() > sc_wait:
            raise RuntimeError(f"the stopped S3 worker was never marked lost\n{stack.logs()}")
        time.sleep(0.2)
    env.s3_workers += 1
    stack.extra_env["THAW_CACHE_DIR"] = str(env.scratch / "s3" / f"cache-{env.s3_workers}")
    stack.start_worker(f"w{env.s3_workers}")
    stack.wait_pool_ready(opts.pool_refill_s)


def _baseline(env: Env, method: str) -> sc.Sample:
    spec: dict[str, Any] = {"method": method, "spawned_at": time.time()}
    if method == "naive":
        spec["model_dir"] = str(env.dirs["model"])
    else:
        spec.update(env.raw_s3, scratch=str(env.scratch))
    result = run_fresh_process(TRIAL_MODULE, spec).result
    phases_ms = {k: v * 1000 for k, v in result["phases"].items() if k.endswith("_s")}
    return sc.Sample(float(result["total_s"]), True, phases_ms)


def run_cold_row(env: Env, row: str, opts: Options) -> sc.Sample:
    if row in ("naive", "boto3_s3"):
        return _baseline(env, "naive" if row == "naive" else "boto3")
    stack = {
        "thaw_pool_hit": env.pool,
        "thaw_pool_miss": env.nopool,
        "thaw_pool_miss_spawn": env.spawn,
        "thaw_s3": env.s3,
    }[row]
    for _ in range(POOL_RETRIES):
        sample = sc.cold_call(stack, COLD_FN)
        if row == "thaw_s3":  # the next trial, or retry, starts with an empty disk cache
            _settle(env, opts)
            _fresh_s3_worker(env, opts)
        _settle(env, opts)
        if row in MISS_ROWS or sample.pool_hit:
            return sample
        # The pool had not refilled yet: this row measures pool hits, so try again.
        env.pool_refill_misses[row] = env.pool_refill_misses.get(row, 0) + 1
    raise RuntimeError(
        f"{row}: no pool hit in {POOL_RETRIES} cold starts; the pool does not refill "
        f"within {opts.pool_refill_s:g} s here (see the worker logs)"
    )


def run_trace(env: Env, opts: Options, bundle_spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out = {}
    for mode, min_replicas in (("scale_to_zero", 0), ("keep_warm", 1)):
        name = f"trace-{mode.replace('_', '-')}"
        spec = {**bundle_spec, "name": name}
        spec["scaling"] = {
            **spec["scaling"],
            "min_replicas": min_replicas,
            "idle_timeout_s": TRACE_IDLE_TIMEOUT_S,
        }
        env.pool.deploy(spec)
        if min_replicas:
            sc.wait_ready_replica(env.pool, name)
        env.pool.wait_pool_ready(opts.pool_refill_s)
        out[mode] = report.trace_summary(sc.bursty_trace(env.pool, name, opts.trace))
    return out


def run(opts: Options, console: Console) -> dict[str, Any]:
    steps = opts.trials * len(COLD_ROWS) + 3
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("setup", total=steps)

        def say(text: str) -> None:
            progress.update(task, description=text)

        with environment(opts, say) as env:
            cold: dict[str, list[sc.Sample]] = {r: [] for r in COLD_ROWS}
            for trial in range(opts.trials):
                for row in round_robin_order(list(COLD_ROWS), trial):
                    say(f"trial {trial + 1}/{opts.trials}: {row}")
                    cold[row].append(run_cold_row(env, row, opts))
                    progress.advance(task)
            say("warm calls")
            warm = sc.warm_calls(env.pool, WARM_FN, opts.warm_calls)
            progress.advance(task)
            say("adapter switches on a warm replica")
            switches = sc.adapter_switches(env.pool, WARM_FN, opts.switch_pairs)
            progress.advance(task)
            say("bursty trace, without and with keep-warm")
            spec = setup.function_spec(_bundle(env), "x", min_replicas=0, idle_timeout_s=1)
            trace = run_trace(env, opts, spec)
            progress.advance(task)
            model_bytes = setup.model_bytes(env.dirs["model"])
    scenarios = {k: report.sample_summary(v) for k, v in cold.items()}
    scenarios["thaw_warm"] = report.sample_summary(warm)
    scenarios["adapter_switch_call"] = report.sample_summary(switches.switch)
    scenarios["adapter_switch"] = report.summary(switches.overhead_s())
    size = setup.QUICK_MODEL if opts.quick else setup.FULL_MODEL
    extra = {
        "model": {"bytes": model_bytes, **vars(size)},
        "trials": opts.trials,
        "quick": opts.quick,
        "machine": machine_description(),
        "pool_refill_misses": env.pool_refill_misses,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    return report.figures(scenarios, trace, opts.trace, extra)


def _bundle(env: Env) -> str:
    with env.pool.client() as c:
        r = c.get(f"/v1/functions/{COLD_FN}")
        r.raise_for_status()
        return str(r.json()["spec"]["bundle"])


def run_model(opts: Options, console: Console) -> dict[str, Any]:
    """The ``--model`` run: its rows, with a progress bar over the trials."""
    from bench._coldstart_model import ROWS, ModelRun, measure

    assert opts.model is not None
    spec = ModelRun(
        opts.model, list(opts.adapters), opts.trials, opts.keep, opts.data_dir, opts.device
    )
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("checking the model", total=opts.trials * len(ROWS))

        def say(text: str) -> None:
            progress.update(task, description=text)
            if not console.is_terminal:  # no live bar in a log: one line per step
                console.log(text)

        return measure(spec, say, lambda: progress.advance(task))


def main_model(opts: Options, console: Console) -> int:
    from bench._user_model import BadInput

    try:
        doc = run_model(opts, console)
    except BadInput as exc:
        Console(stderr=True).print(f"[red]{exc}[/red]")
        return 2
    for table in (report.scenario_table(doc), report.ratio_table(doc)):
        render_table(table, console)
    if opts.json:
        write_json(doc, "-")
    return 0


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(sys.argv[1:] if argv is None else argv)
    console = Console(stderr=opts.json)
    if opts.model is not None:
        return main_model(opts, console)
    doc = run(opts, console)
    for table in (report.scenario_table(doc), report.trace_table(doc), report.ratio_table(doc)):
        render_table(table, console)
    report.write_png(doc, opts.png)
    console.print(f"chart: {opts.png}")
    if opts.json:
        write_json(doc, "-")
    return 0


if __name__ == "__main__":
    sys.exit(main())
