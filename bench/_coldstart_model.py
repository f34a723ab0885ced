"""``thaw bench coldstart --model DIR [--adapter DIR ...]``: the cold-start table for a
user's model.

The model (any causal LM transformers loads, sharded or not, in its own dtype) and
its adapters are checked first (``bench._user_model``: what is wrong is said before
anything starts), pushed to a scratch store with ``bench/causal_lm_fn`` (build from
``config.json`` on meta, fill with the streamed weights, PEFT adapters, one forward
pass), and served by three thaw installations (server + worker each, SQLite and the
filesystem broker, as in ``bench/coldstart.py``):

- ``pool``:   a pool of 1, RAM tier off     → pool hit, weights in the disk cache
- ``nopool``: no pool (a fork of the zygote) → pool miss, weights in the disk cache
- ``ram``:    a pool of 1, a host-RAM tier   → pool hit, weights in the RAM tier

against the naive row: a fresh process that imports torch and transformers, runs
``from_pretrained`` on the directory and does the same forward pass. Trials are
interleaved round-robin; the table has the medians of ``--trials`` with the phases.

Beside the ratios, one figure: what a RAM-tier pool hit costs over a warm call (the
median cold call less the median warm call, two warm calls made on the replica each
RAM-tier trial started), against a budget of 1.5 x (weight bytes / memcpy bandwidth)
+ 100 ms, the bandwidth measured in the same run (``memcpy_bandwidth``).
The scratch directory (store, caches, installations) is removed at the end unless
``--keep``.
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import _coldstart_report as report
from bench import _coldstart_scenarios as sc
from bench import _coldstart_setup as setup
from bench._common import REPO_ROOT, machine_description, round_robin_order, run_fresh_process
from bench._user_model import GIB, Checked, check_adapter, check_model, check_room

FUNCTION_DIR = REPO_ROOT / "bench" / "causal_lm_fn"
FUNCTION = "bench-model"
MODEL_REF = "bench-model:v1"
ROWS = ("naive", "thaw_pool_miss", "thaw_pool_hit", "thaw_ram_tier")
STACKS = {"thaw_pool_miss": "nopool", "thaw_pool_hit": "pool", "thaw_ram_tier": "ram"}
POOL_RETRIES = 3
POOL_REFILL_S = 8.0
WARM_AFTER = "thaw_ram_tier"  # the row whose replica also serves warm calls
WARM_CALLS = 2
MEMCPY_TRIALS = 5
OVERHEAD_COPIES = 1.5  # the budget: this many copies of the weights at memcpy speed ...
OVERHEAD_FIXED_S = 0.1  # ... and this much fixed cost
IDLE_TIMEOUT_S = 1.0
TARGETS = (
    report.Target("pool hit / naive", "thaw_pool_hit", "naive", 0.1),
    report.Target("pool miss / naive", "thaw_pool_miss", "naive", 1 / 3),
    report.Target("RAM tier / naive", "thaw_ram_tier", "naive", 0.1),
)


@dataclass(frozen=True)
class ModelRun:
    model: Path
    adapters: list[Path]
    trials: int
    keep: bool
    data_dir: Path
    device: str = "cpu"


def checked_inputs(run: ModelRun) -> tuple[Checked, dict[str, Path]]:
    """The model and adapters (by the name calls use), checked; room for the run too."""
    model = check_model(run.model)
    adapters: dict[str, Path] = {}
    for path in run.adapters:
        check_adapter(path, model)
        adapters[_adapter_name(path, adapters)] = path
    # Store + three disk caches on disk; the RAM tier, a replica and the naive
    # process's copy in RAM, plus the three installations' own processes.
    disk = 4 * model.weight_bytes + GIB // 4
    ram = 4 * model.weight_bytes + 3 * GIB
    check_room(run.data_dir, disk, ram)
    return model, adapters


def _adapter_name(path: Path, taken: dict[str, Path]) -> str:
    base = "".join(c if c.isalnum() or c in "-_" else "-" for c in path.resolve().name) or "a"
    name, n = base, 2
    while name in taken:
        name, n = f"{base}-{n}", n + 1
    return name


def _push(model: Path, adapters: dict[str, Path], store: Path) -> str:
    """Model, adapters and the function's code into ``store``; the bundle digest."""
    from snapshotter.manifest import ArtifactKind
    from snapshotter.push import push_directory
    from snapshotter.registry import Registry
    from snapshotter.stores import LocalStore

    registry = Registry(LocalStore(store))
    push_directory(model, MODEL_REF, registry)
    for name, path in adapters.items():
        push_directory(path, f"bench-adapter-{name}:v1", registry)
    kind = ArtifactKind.BUNDLE
    return push_directory(FUNCTION_DIR, "bundles/bench-model:v1", registry, kind=kind).digest


def function_spec(bundle: str, adapters: dict[str, Path], device: str = "cpu") -> dict[str, Any]:
    return {
        "name": FUNCTION,
        "bundle": bundle,
        "entry": "app:CausalLM",
        "model": MODEL_REF,
        "adapters": [{"name": n, "ref": f"bench-adapter-{n}:v1"} for n in adapters],
        "device": device,
        "timeout_s": 600,
        "scaling": {"min_replicas": 0, "max_replicas": 1, "idle_timeout_s": IDLE_TIMEOUT_S},
    }


def _stack_env(scratch: Path, name: str, weight_bytes: int) -> dict[str, str]:
    env = {
        "THAW_CACHE_DIR": str(scratch / name / "cache"),
        "THAW_WORKER_POOL_SIZE": "0" if name == "nopool" else "1",
        "THAW_RAM_TIER_MAX_BYTES": "0",
    }
    if name == "ram":
        shm = Path("/dev/shm")
        env["THAW_RAM_TIER_DIR"] = str((shm if shm.is_dir() else scratch) / f"{scratch.name}-ram")
        env["THAW_RAM_TIER_MAX_BYTES"] = str(2 * weight_bytes + (64 << 20))
    return env


@dataclass
class Env:
    model: Checked
    adapters: dict[str, Path]
    stacks: dict[str, setup.BenchStack]
    scratch: Path
    device: str = "cpu"
    pool_refill_misses: int = 0


@contextmanager
def environment(run: ModelRun, say: Callable[[str], None]) -> Iterator[Env]:
    model, adapters = checked_inputs(run)
    with ExitStack() as ctx:
        scratch = run.data_dir / f"coldstart-model-{os.getpid()}-{int(time.time())}"
        scratch.mkdir(parents=True)
        if run.keep:
            ctx.callback(say, f"kept: {scratch} (store, caches, installations)")
        else:
            ctx.callback(shutil.rmtree, scratch, ignore_errors=True)
        say(f"pushing {model.root} ({model.weight_bytes / 1e6:.0f} MB) to a scratch store")
        bundle = _push(model.root, adapters, scratch / "store")
        say("starting three thaw installations (server + worker each)")
        stacks = {}
        for name in ("pool", "nopool", "ram"):
            env = _stack_env(scratch, name, model.weight_bytes)
            if "THAW_RAM_TIER_DIR" in env:
                ctx.callback(shutil.rmtree, env["THAW_RAM_TIER_DIR"], ignore_errors=True)
            running = setup.running(scratch / name, str(scratch / "store"), env)
            stacks[name] = ctx.enter_context(running)
            stacks[name].deploy(function_spec(bundle, adapters, run.device))
        state = Env(model, adapters, stacks, scratch, run.device)
        say("priming the caches (one untimed cold start each, through every adapter)")
        for stack in stacks.values():
            sc.timed_call(stack, FUNCTION)
            for name in adapters:
                sc.timed_call(stack, FUNCTION, name)
        _settle(state)
        yield state


def _settle(env: Env) -> None:
    """Every installation at zero, pools full: nothing runs during a trial."""
    for stack in env.stacks.values():
        stack.wait_scaled_to_zero(FUNCTION)
    for name in ("pool", "ram"):
        env.stacks[name].wait_pool_ready(POOL_REFILL_S)


def _naive(env: Env) -> sc.Sample:
    spec = {
        "method": "naive",
        "model_dir": str(env.model.root),
        "forward_ids": True,
        "device": env.device,
    }
    result = run_fresh_process("bench._coldstart_trials", {**spec, "spawned_at": time.time()})
    phases = {k: v * 1000 for k, v in result.result["phases"].items() if k.endswith("_s")}
    return sc.Sample(float(result.result["total_s"]), True, phases)


def cold_row(env: Env, row: str) -> tuple[sc.Sample, list[sc.Sample]]:
    """A cold start of ``row``, and (``WARM_AFTER``) warm calls on the replica it started."""
    if row == "naive":
        return _naive(env), []
    stack = env.stacks[STACKS[row]]
    for _ in range(POOL_RETRIES):
        sample = sc.cold_call(stack, FUNCTION)
        warm = []
        if row == WARM_AFTER:
            warm = [sc.timed_call(stack, FUNCTION) for _ in range(WARM_CALLS)]
            if any(w.cold for w in warm):
                raise RuntimeError(f"{row}: a call right after a cold start was cold again")
        _settle(env)
        if row == "thaw_pool_miss" or sample.pool_hit:
            return sample, warm
        env.pool_refill_misses += 1  # the pool had not refilled: a hit row tries again
    raise RuntimeError(f"{row}: no pool hit in {POOL_RETRIES} cold starts; see the worker logs")


def memcpy_bandwidth(nbytes: int, trials: int = MEMCPY_TRIALS) -> float:
    """Bytes per second copying ``nbytes`` from RAM into fresh memory: ``bench/load.py``'s
    memcpy ceiling, measured here so the budget and the cold starts share a run."""
    from bench._load_methods import method_memcpy

    times = [method_memcpy({"total_bytes": nbytes}).span.load_s for _ in range(trials)]
    return nbytes / statistics.median(times)


def overhead(
    cold: list[sc.Sample], warm: list[sc.Sample], weight_bytes: int, bytes_per_s: float
) -> dict[str, Any]:
    """The RAM-tier pool hit's cost over a warm call against its budget."""
    cold_s = statistics.median(s.total_s for s in cold)
    warm_s = statistics.median(s.total_s for s in warm)
    budget = OVERHEAD_COPIES * weight_bytes / bytes_per_s + OVERHEAD_FIXED_S
    return {
        "cold_median_s": cold_s,
        "warm_median_s": warm_s,
        "overhead_s": cold_s - warm_s,
        "memcpy_gb_per_s": bytes_per_s / 1e9,
        "budget_s": budget,
        "met": cold_s - warm_s <= budget,
    }


def overhead_ratio(o: dict[str, Any]) -> dict[str, Any]:
    """An ``overhead`` as a row of the targets table (seconds, lower is better)."""
    name = (
        f"RAM-tier pool hit - warm call, s (<= {OVERHEAD_COPIES:g} x weights / memcpy "
        f"{o['memcpy_gb_per_s']:.2f} GB/s + {OVERHEAD_FIXED_S:g} s)"
    )
    return {"name": name, "value": o["overhead_s"], "target": o["budget_s"], "met": o["met"]}


def measure(run: ModelRun, say: Callable[[str], None], step: Callable[[], None]) -> dict[str, Any]:
    """Every row ``run.trials`` times, round-robin; the figures document."""
    with environment(run, say) as env:
        cold: dict[str, list[sc.Sample]] = {r: [] for r in ROWS}
        warm: list[sc.Sample] = []
        for trial in range(run.trials):
            for row in round_robin_order(list(ROWS), trial):
                say(f"trial {trial + 1}/{run.trials}: {row}")
                sample, after = cold_row(env, row)
                cold[row].append(sample)
                warm.extend(after)
                step()
        say("measuring the memcpy bandwidth")
        bytes_per_s = memcpy_bandwidth(env.model.weight_bytes)
    samples = {**cold, "thaw_warm": warm}
    scenarios = {k: report.sample_summary(v) for k, v in samples.items()}
    for key, s in scenarios.items():
        s["label"] = report.LABELS[key]
    over = overhead(cold[WARM_AFTER], warm, env.model.weight_bytes, bytes_per_s)
    return {
        "scenarios": scenarios,
        "overhead": over,
        "ratios": [*report.ratios(scenarios, TARGETS), overhead_ratio(over)],
        "model": {
            "directory": str(env.model.root),
            "bytes": env.model.weight_bytes,
            "shards": len(env.model.shards),
            "adapters": {n: str(p) for n, p in env.adapters.items()},
        },
        "trials": run.trials,
        "pool_refill_misses": env.pool_refill_misses,
        "machine": machine_description(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
