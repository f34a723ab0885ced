"""Loader benchmark: thaw's loader side by side with the alternatives, in one run.

    python bench/load.py [--size-mb 1024] [--trials 5] [--methods thaw,runai,...]
                         [--quick] [--json PATH|-] [--data-dir bench/.data]
    python bench/load.py --model DIR [--trials 5] [--methods ...] [--keep] [--json PATH|-]

``--model`` measures a Hugging Face model directory's own safetensors files
instead of a synthetic Llama (checked first: ``bench._user_model``); the store,
disk cache, tensorizer file and scratch space it makes are under a directory of
``--data-dir`` that is removed at the end unless ``--keep``.

Every trial is a fresh process (``bench._load_methods``); trials are
interleaved round-robin over the rows. How each row is measured, and what
"cold" and "warm" mean, is in ``bench/README.md`` and ``bench._load_rows``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from bench import _load_report as report
from bench._common import files_under, round_robin_order, run_fresh_process, write_json
from bench._load_rows import CATALOG, COLD, S3, WARM, Row, select_rows, skip_reason
from bench._load_setup import RawUpload, ensure_tensorizer_file, moto_server, upload_raw_model
from bench._model import ModelInfo, ensure_model
from bench._pagecache import drop_page_cache, resident_fraction, warm_page_cache

DEFAULT_SIZE_MB = 1024
QUICK_SIZE_MB = 8
DEFAULT_TRIALS = 5
TRIAL_MODULE = "bench._load_methods"


@dataclass(frozen=True)
class Options:
    size_mb: int
    trials: int
    methods: list[str] | None
    quick: bool
    json: str | None
    data_dir: Path
    drop: str  # "auto" (drop_caches when allowed, else fadvise) | "fadvise"
    model: Path | None = None
    keep: bool = False


def parse_args(argv: list[str]) -> Options:
    p = argparse.ArgumentParser(prog="bench/load.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--size-mb", type=int, default=None, help="model size (default 1024; 8 quick)")
    p.add_argument("--trials", type=int, default=None, help="trials per row (default 5; 1 quick)")
    p.add_argument("--methods", default=None, help="comma-separated families or row keys")
    p.add_argument("--quick", action="store_true", help="tiny model, one trial: a smoke run")
    p.add_argument("--json", default=None, metavar="PATH", help="write results; '-' = stdout")
    p.add_argument("--data-dir", type=Path, default=Path(__file__).resolve().parent / ".data")
    p.add_argument("--drop", choices=["auto", "fadvise"], default="auto")
    p.add_argument("--model", type=Path, default=None, help="a Hugging Face model directory")
    p.add_argument("--keep", action="store_true", help="keep the --model run's store and cache")
    a = p.parse_args(argv)
    if a.model is not None and (a.size_mb is not None or a.quick):
        p.error("--model measures that model: --size-mb and --quick do not apply")
    if a.keep and a.model is None:
        p.error("--keep goes with --model")
    trials = a.trials if a.trials is not None else (1 if a.quick else DEFAULT_TRIALS)
    if trials < 1:
        p.error("--trials must be at least 1")
    size_mb = (
        a.size_mb if a.size_mb is not None else (QUICK_SIZE_MB if a.quick else DEFAULT_SIZE_MB)
    )
    methods = [m.strip() for m in a.methods.split(",") if m.strip()] if a.methods else None
    return Options(size_mb, trials, methods, a.quick, a.json, a.data_dir, a.drop, a.model, a.keep)


@dataclass
class BenchEnv:
    """Everything setup made, shared by every trial."""

    model: ModelInfo
    scratch: Path
    tensorizer_file: Path | None = None
    thaw_store: dict[str, Any] | None = None
    thaw_cache: Path | None = None
    raw_s3: RawUpload | None = None
    thaw_s3_store: dict[str, Any] | None = None
    ram_tier_dir: Path | None = None

    def files_for(self, row: Row) -> list[Path]:
        if row.files == "model":
            return [Path(f) for f in self.model.files]
        if row.files == "tensorizer" and self.tensorizer_file:
            return [self.tensorizer_file]
        if row.files == "thaw_cache" and self.thaw_cache:
            return files_under([self.thaw_cache])
        if row.files == "thaw_store" and self.thaw_store:
            return files_under([Path(self.thaw_store["url"])])
        return []


def _setup_thaw_local(env: BenchEnv, data_dir: Path) -> None:
    from bench._thaw import push_model

    env.thaw_store = {"url": str(data_dir / "thaw-store"), "endpoint_url": None}
    push_model(env.model.directory, env.thaw_store)
    env.thaw_cache = data_dir / f"thaw-cache-{env.model.checksum:016x}"
    # A new cache every run, filled by one load that writes every chunk through: the
    # entries are then what the loader of this checkout writes, not an older one.
    shutil.rmtree(env.thaw_cache, ignore_errors=True)
    run_fresh_process(TRIAL_MODULE, _thaw_spec(env, env.thaw_store, env.thaw_cache, "cpu"))


def _setup_ram_tier(env: BenchEnv, stack: ExitStack) -> None:
    """A host-RAM tier on tmpfs, filled by one load; removed when the bench ends."""
    if env.thaw_store is None or env.thaw_cache is None:
        raise RuntimeError("the RAM tier row needs the local thaw store; set it up first")
    shm = Path("/dev/shm")
    tier = (shm if shm.is_dir() else env.scratch) / f"thaw-bench-ram-{os.getpid()}"
    stack.callback(shutil.rmtree, tier, ignore_errors=True)
    env.ram_tier_dir = tier
    spec = _thaw_spec(env, env.thaw_store, env.thaw_cache, "cpu")
    run_fresh_process(TRIAL_MODULE, {**spec, "ram_tier_dir": str(tier)})


def _setup_s3(env: BenchEnv, stack: ExitStack, rows: list[Row], console: Console) -> None:
    from bench._thaw import create_s3_bucket, push_model

    endpoint = stack.enter_context(moto_server())
    if any(r.family == "boto3-s3" for r in rows):
        console.log(f"uploading the model's shards to S3 at {endpoint}")
        env.raw_s3 = upload_raw_model(endpoint, env.model)
    if any(r.family == "thaw-s3" for r in rows):
        console.log("pushing the model to thaw's S3 store")
        env.thaw_s3_store = {"url": "s3://bench-thaw/artifacts", "endpoint_url": endpoint}
        create_s3_bucket(env.thaw_s3_store)
        push_model(env.model.directory, env.thaw_s3_store)


def _user_model(opts: Options, stack: ExitStack, console: Console) -> tuple[ModelInfo, Path]:
    """The ``--model`` directory checked and described, and the run's own work directory
    (removed at the end unless ``--keep``). Raises ``BadInput`` before anything is made."""
    from bench._user_model import GIB, check_model, check_room, model_info

    assert opts.model is not None
    checked = check_model(opts.model)
    # Store, disk cache, tensorizer file, S3 objects (raw and thaw's), a boto3 download;
    # in RAM a trial's copy, the memcpy row's two, the RAM tier and the S3 server's.
    work = opts.data_dir / f"load-model-{os.getpid()}"
    check_room(work, 6 * checked.weight_bytes + GIB // 4, 5 * checked.weight_bytes + GIB)
    console.log(f"model: {checked.root} ({checked.weight_bytes / 1e6:.0f} MB in "
                f"{len(checked.shards)} files); reading it once for its checksum")  # fmt: skip
    info = model_info(checked)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    if opts.keep:
        stack.callback(console.log, f"kept: {work} (store, cache, tensorizer file)")
    else:
        stack.callback(shutil.rmtree, work, ignore_errors=True)
    return info, work


_RAM_FAMILIES = {"thaw-ram", "thaw-ram-cuda", "thaw-ram-cuda-unpinned"}


def setup(opts: Options, rows: list[Row], stack: ExitStack, console: Console) -> BenchEnv:
    opts.data_dir.mkdir(parents=True, exist_ok=True)
    if opts.model is not None:
        model, work = _user_model(opts, stack, console)
    else:
        console.log(f"model: {opts.size_mb} MiB of bf16 Llama-shaped shards under {opts.data_dir}")
        model, work = ensure_model(opts.data_dir, opts.size_mb), opts.data_dir
    scratch = work / "scratch"
    shutil.rmtree(scratch, ignore_errors=True)
    env = BenchEnv(model=model, scratch=scratch)
    families = {r.family for r in rows}
    if "tensorizer" in families:
        console.log("writing the model's tensorizer file")
        env.tensorizer_file = ensure_tensorizer_file(env.model, work)
    if families & {"thaw", "thaw-cuda", "thaw-store", *_RAM_FAMILIES}:
        console.log("pushing the model to thaw's local store and filling its disk cache")
        _setup_thaw_local(env, work)
    if families & _RAM_FAMILIES:
        console.log("filling thaw's host-RAM tier")
        _setup_ram_tier(env, stack)
    if any(r.temperature == S3 for r in rows):
        _setup_s3(env, stack, rows, console)
    return env


def _thaw_spec(env: BenchEnv, store: dict[str, Any], cache: Path, device: str) -> dict[str, Any]:
    return {
        "method": "thaw",
        "store": store,
        "cache_dir": str(cache),
        "device": device,
        "expected_checksum": env.model.checksum,
    }


@contextmanager
def trial_spec(row: Row, env: BenchEnv, trial: int) -> Iterator[dict[str, Any]]:
    """The spec for one trial; scratch space it names is removed afterwards."""
    scratch = env.scratch / f"{row.family}-{trial}"
    spec: dict[str, Any] = {
        "method": row.method,
        "device": row.device,
        "files": env.model.files,
        "total_bytes": env.model.total_tensor_bytes,
        "expected_checksum": env.model.checksum,
        "tensorizer_file": str(env.tensorizer_file) if env.tensorizer_file else None,
    }
    if row.family == "boto3-s3" and env.raw_s3:
        spec.update(s3=env.raw_s3.spec(), scratch_dir=str(scratch))
    elif row.family == "thaw-store" and env.thaw_store:
        spec.update(_thaw_spec(env, env.thaw_store, scratch / "cache", row.device))
    elif row.family == "thaw-s3" and env.thaw_s3_store:
        spec.update(_thaw_spec(env, env.thaw_s3_store, scratch / "cache", row.device))
    elif row.method == "thaw" and env.thaw_store and env.thaw_cache:
        spec.update(_thaw_spec(env, env.thaw_store, env.thaw_cache, row.device))
        if row.family in _RAM_FAMILIES:
            spec["ram_tier_dir"] = str(env.ram_tier_dir)
            # A pool process pins the tier's pages while it waits; this row pays it in the load.
            spec["pin_ahead"] = row.family != "thaw-ram-cuda-unpinned"
    try:
        yield spec
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def prepare_cache(row: Row, env: BenchEnv, drop: str) -> dict[str, Any]:
    """Put the row's files in its temperature; report how and what resulted."""
    files = env.files_for(row)
    if row.temperature == COLD:
        how = drop_page_cache(files, allow_global=drop == "auto")
        return {"page_cache": how, "resident_fraction": resident_fraction(files)}
    if row.temperature == WARM and files:
        warm_page_cache(files)
        return {"page_cache": "read once", "resident_fraction": resident_fraction(files)}
    return {}


def run_trials(
    rows: list[Row], env: BenchEnv, opts: Options, console: Console
) -> dict[str, list[dict[str, Any]]]:
    """Every row ``opts.trials`` times, round-robin; the per-row trial records."""
    records: dict[str, list[dict[str, Any]]] = {r.key: [] for r in rows}
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("trials", total=len(rows) * opts.trials)
        for trial in range(opts.trials):
            for row in round_robin_order(rows, trial):
                desc = f"trial {trial + 1}/{opts.trials}  {row.label} ({row.temperature})"
                progress.update(task, description=desc)
                cache_state = prepare_cache(row, env, opts.drop)
                with trial_spec(row, env, trial) as spec:
                    outcome = run_fresh_process(TRIAL_MODULE, spec)
                record = {**outcome.result, **cache_state, "process_s": outcome.process_s}
                records[row.key].append(record)
                progress.advance(task)
                if not console.is_terminal:  # no live bar in a log: one line per trial
                    console.log(f"{desc}: {record['load_s']:.3f} s")
    return records


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(sys.argv[1:] if argv is None else argv)
    # With --json - stdout carries exactly one JSON object; everything else goes to stderr.
    console = Console(stderr=opts.json == "-")
    import torch

    has_cuda = torch.cuda.is_available()
    try:
        chosen = select_rows(CATALOG, opts.methods)
    except ValueError as exc:
        console.print(f"[red]{exc}[/red]")
        return 2
    skipped = {r.key: reason for r in chosen if (reason := skip_reason(r, has_cuda=has_cuda))}
    runnable = [r for r in chosen if r.key not in skipped]
    from bench._user_model import BadInput

    with ExitStack() as stack:
        try:
            env = setup(opts, runnable, stack, console)
        except BadInput as exc:
            Console(stderr=True).print(f"[red]{exc}[/red]")
            return 2
        records = run_trials(runnable, env, opts, console)
    doc = report.build_document(opts.__dict__, env.model, chosen, records, skipped)
    report.print_report(doc, console)
    if opts.json:
        write_json(doc, opts.json)
    return 0 if report.all_checksums_ok(doc) else 1


if __name__ == "__main__":
    sys.exit(main())
