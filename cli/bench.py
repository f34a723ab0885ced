"""``thaw bench``: the benchmarks in ``bench/``, run from a checkout of the repository.

    thaw bench coldstart [--trials N] [--json] [--png PATH] [--quick]
    thaw bench coldstart --model DIR [--adapter DIR ...] [--device cuda] [--trials N] [--keep]
    thaw bench load [--model DIR] [--trials N] [--methods ...] [--keep] [--json PATH|-]
    thaw bench llm [--model DIR] [--quick] [--streams 1,8,32] [--json PATH] ...
    thaw bench guidellm [--model DIR] [--concurrency 1,4] [--seconds 30] [--json PATH] ...

They start their own thaw installations (server + worker processes) and
stores; nothing of the caller's ``THAW_*`` setup is used.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from cli.control import fail

REPO_ROOT = Path(__file__).resolve().parents[1]

app = typer.Typer(no_args_is_help=True, help="Benchmarks (from a checkout of the repository).")


def _bench_main(script: str) -> Callable[[list[str]], int]:
    """``main`` of ``bench/<script>.py`` in this checkout."""
    if not (REPO_ROOT / "bench" / f"{script}.py").is_file():
        raise fail(f"{REPO_ROOT / 'bench'} is missing: run `thaw bench` from a thaw checkout")
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    main: Callable[[list[str]], int] = importlib.import_module(f"bench.{script}").main
    return main


def _pass_on(script: str, model: Path | None, args: list[str]) -> None:
    """Run ``bench/<script>.py`` with ``--model`` (checked first) and ``args`` as given."""
    main = _bench_main(script)
    from bench.llm import check_model_dir

    if model is not None and (why := check_model_dir(model)) is not None:
        raise fail(f"--model: {why}")
    raise typer.Exit(main([*(["--model", str(model)] if model is not None else []), *args]))


@app.command("coldstart")
def coldstart(
    trials: Annotated[
        int | None, typer.Option(help="cold trials per row (5; 1 with --quick)")
    ] = None,
    json: Annotated[
        bool, typer.Option("--json", help="print the figures as one JSON object")
    ] = False,
    png: Annotated[Path | None, typer.Option(help="chart path (bench/.data/coldstart.png)")] = None,
    quick: Annotated[
        bool, typer.Option("--quick", help="tiny model, one trial: a smoke run")
    ] = False,
    model: Annotated[
        Path | None, typer.Option(help="a Hugging Face model directory (default: the example)")
    ] = None,
    adapter: Annotated[
        list[Path] | None, typer.Option(help="a PEFT adapter of --model (repeatable)")
    ] = None,
    keep: Annotated[
        bool, typer.Option("--keep", help="keep the --model run's scratch store and caches")
    ] = False,
    data_dir: Annotated[
        Path | None, typer.Option(help="where models and scratch go (bench/.data)")
    ] = None,
    device: Annotated[str | None, typer.Option(help="with --model: cpu (default) or cuda")] = None,
) -> None:
    """Cold starts: naive vs thaw (pool hit, pool miss, S3), warm calls, adapter switch, trace;
    with --model, naive vs thaw's pool miss, pool hit and RAM tier for that model."""
    main = _bench_main("coldstart")

    argv = [*(["--trials", str(trials)] if trials is not None else [])]
    argv += [*(["--png", str(png)] if png is not None else [])]
    argv += [*(["--json"] if json else []), *(["--quick"] if quick else [])]
    argv += [*(["--model", str(model)] if model is not None else []), *(["--keep"] if keep else [])]
    for path in adapter or []:
        argv += ["--adapter", str(path)]
    argv += [*(["--data-dir", str(data_dir)] if data_dir is not None else [])]
    argv += [*(["--device", device] if device is not None else [])]
    raise typer.Exit(main(argv))


@app.command("load")
def load(
    model: Annotated[
        Path | None, typer.Option(help="a Hugging Face model directory (default: synthetic)")
    ] = None,
    trials: Annotated[int | None, typer.Option(help="trials per row (5; 1 with --quick)")] = None,
    methods: Annotated[
        str | None, typer.Option(help="comma-separated rows or families (default: all)")
    ] = None,
    size_mb: Annotated[
        int | None, typer.Option(help="synthetic model size without --model (1024)")
    ] = None,
    json: Annotated[
        str | None, typer.Option("--json", help="write the figures as JSON to PATH (- stdout)")
    ] = None,
    keep: Annotated[
        bool, typer.Option("--keep", help="keep the --model run's store, cache and files")
    ] = False,
    quick: Annotated[
        bool, typer.Option("--quick", help="tiny synthetic model, one trial: a smoke run")
    ] = False,
    data_dir: Annotated[
        Path | None, typer.Option(help="where models and scratch go (bench/.data)")
    ] = None,
) -> None:
    """Loaders: thaw (store, disk cache, RAM tier) vs safetensors, mmap, installed peers,
    raw read and memcpy ceilings: GB/s and ratios."""
    main = _bench_main("load")

    options = {"--model": model, "--trials": trials, "--methods": methods}
    options |= {"--size-mb": size_mb, "--json": json, "--data-dir": data_dir}
    argv = [x for k, v in options.items() if v is not None for x in (k, str(v))]
    argv += [*(["--keep"] if keep else []), *(["--quick"] if quick else [])]
    raise typer.Exit(main(argv))


@app.command(
    "llm",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)
def llm(
    ctx: typer.Context,
    model: Annotated[
        Path | None, typer.Option(help="a model directory (default: the bench's example)")
    ] = None,
) -> None:
    """LLM streams and cold start: thaw's OpenAI routes beside the engine in-process,
    sequential generate and transformers serve (every option of bench/llm.py passes on)."""
    _pass_on("llm", model, ctx.args)


@app.command(
    "guidellm",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)
def guidellm(
    ctx: typer.Context,
    model: Annotated[
        Path | None, typer.Option(help="a model directory (default: the bench's example)")
    ] = None,
) -> None:
    """guidellm beside thaw loadtest on the same load, from guidellm's own environment
    (made on the first run; every option of bench/guidellm.py passes on)."""
    _pass_on("guidellm", model, ctx.args)
