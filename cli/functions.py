"""``thaw deploy DIR`` and ``thaw functions ls/show/rm/rollback``.

``thaw deploy DIR`` reads ``DIR/thaw.toml`` (or ``thaw.yaml``; the format is
documented in ``control_plane.spec``), pushes DIR to the store as a code
bundle (``bundles/<name>:latest``, through the snapshotter; the store comes
from THAW_STORE/--store like ``thaw models push``), then sends the spec with
the bundle's digest to the control plane, which checks the model, adapters
and that the entry imports before the new version goes live. With
``--canary PCT`` the new version takes PCT % of calls beside the active one
(``thaw canary status/promote/abort``).
"""

from __future__ import annotations

import json
import tempfile
import tomllib
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from pydantic import ValidationError
from rich.table import Table

from cli import health
from cli.control import check, client, err, fail, out, print_json
from cli.scale import scale
from cli.store import STORE_HELP, open_registry
from control_plane.settings import Settings
from control_plane.spec import FunctionSpec
from snapshotter.errors import SnapshotterError
from snapshotter.manifest import ArtifactKind
from snapshotter.push import push_directory

app = typer.Typer(no_args_is_help=True, help="List, show, scale, delete and roll back functions.")
app.command("scale")(scale)
PLACEHOLDER_DIGEST = "blake3:" + "0" * 64


def read_spec_file(directory: Path) -> dict[str, Any]:
    """The spec in ``thaw.toml`` or ``thaw.yaml``; raises ``typer.Exit`` when absent/bad."""
    toml_path, yaml_path = directory / "thaw.toml", directory / "thaw.yaml"
    try:
        if toml_path.is_file():
            return tomllib.loads(toml_path.read_text())
        if yaml_path.is_file():
            import yaml

            doc = yaml.safe_load(yaml_path.read_text())
            if not isinstance(doc, dict):
                raise fail(f"{yaml_path} must hold a mapping of spec keys")
            return doc
    except (tomllib.TOMLDecodeError, ValueError) as exc:
        raise fail(f"cannot parse the spec in {directory}: {exc}") from None
    raise fail(f"{directory} has no thaw.toml or thaw.yaml; see `thaw deploy --help`")


def validate_spec(doc: dict[str, Any], directory: Path) -> FunctionSpec:
    """Check the file's spec locally (with a placeholder bundle) before pushing anything."""
    try:
        return FunctionSpec.model_validate({**doc, "bundle": PLACEHOLDER_DIGEST})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise fail(f"spec in {directory}: {where}: {first['msg']}") from None


def deploy(
    target: Annotated[
        str,
        typer.Argument(
            metavar="DIRECTORY | NAME",
            help="the function's code directory; with --llm, the LLM function's name",
        ),
    ],
    llm: Annotated[
        str | None,
        typer.Option(
            "--llm",
            metavar="MODEL",
            help="deploy NAME as an LLM function serving the pushed model MODEL "
            "(NAME:TAG; any causal LM transformers loads) behind /openai/v1, no code needed",
        ),
    ] = None,
    adapter: Annotated[
        list[str] | None,
        typer.Option(
            metavar="NAME=REF",
            help="with --llm: a pushed LoRA adapter, called as model NAME:adapter (repeat)",
        ),
    ] = None,
    dtype: Annotated[
        str | None, typer.Option(help="with --llm: auto | float32 | bfloat16 | float16")
    ] = None,
    max_num_seqs: Annotated[
        int | None, typer.Option(help="with --llm: sequences in one batch (default 8)")
    ] = None,
    max_batch_tokens: Annotated[
        int | None, typer.Option(help="with --llm: tokens one engine step takes (default 512)")
    ] = None,
    kv_cache_mb: Annotated[
        int | None, typer.Option(help="with --llm: the KV cache's size in MiB (default 64)")
    ] = None,
    context_length: Annotated[
        int | None, typer.Option(help="with --llm: default the model's max_position_embeddings")
    ] = None,
    store: Annotated[str | None, typer.Option(help=STORE_HELP)] = None,
    canary: Annotated[
        float | None,
        typer.Option(
            min=0, max=100, help="deploy as a canary taking this % of calls (thaw canary ...)"
        ),
    ] = None,
) -> None:
    """Push the code in DIRECTORY and deploy it as a new version of its function; or,
    with --llm MODEL, deploy NAME as an LLM function (its thaw.toml is written for you:
    see control_plane/spec.py)."""
    settings = Settings()
    llm_options = {
        "dtype": dtype,
        "max_num_seqs": max_num_seqs,
        "max_batch_tokens": max_batch_tokens,
        "kv_cache_mb": kv_cache_mb,
        "context_length": context_length,
    }
    with tempfile.TemporaryDirectory(prefix="thaw-llm-") as scratch:
        if llm is not None:
            directory = Path(scratch)
            options = {k: v for k, v in llm_options.items() if v is not None}
            (directory / "thaw.toml").write_text(llm_toml(target, llm, options, adapter or []))
        else:
            given = [f"--{k.replace('_', '-')}" for k, v in llm_options.items() if v is not None]
            if adapter:
                given.append("--adapter")
            if given:
                raise fail(f"{', '.join(given)} go with --llm MODEL (or [llm] in thaw.toml)")
            directory = Path(target)
            if not directory.is_dir():
                raise fail(f"{target} is not a directory (an LLM function: --llm MODEL {target})")
        _deploy(settings, directory, store, canary)


def llm_toml(name: str, model: str, options: dict[str, Any], adapters: list[str]) -> str:
    """The ``thaw.toml`` of an LLM function (``deploy --llm``)."""
    lines = [f"name = {json.dumps(name)}", f"model = {json.dumps(model)}", "", "[llm]"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in options.items()]
    for pair in adapters:
        adapter_name, sep, ref = pair.partition("=")
        if not sep or not adapter_name or not ref:
            raise fail(f"--adapter takes NAME=REF (a pushed adapter), not {pair!r}")
        lines += ["", "[[adapters]]", f"name = {json.dumps(adapter_name)}"]
        lines.append(f"ref = {json.dumps(ref)}")
    return "\n".join(lines) + "\n"


def _deploy(settings: Settings, directory: Path, store: str | None, canary: float | None) -> None:
    spec = validate_spec(read_spec_file(directory), directory)
    try:
        registry = open_registry(settings, store)
        pushed = push_directory(
            directory, f"bundles/{spec.name}:latest", registry, kind=ArtifactKind.BUNDLE
        )
    except SnapshotterError as exc:
        raise fail(str(exc)) from None
    body = spec.model_copy(update={"bundle": pushed.digest}).model_dump(mode="json")
    params = {} if canary is None else {"canary_pct": canary}
    with client(settings) as c:
        fn = check(c.post("/v1/functions", json=body, params=params))
    if canary is not None:
        out.print(
            f"deployed {fn['name']} version {max(fn['versions'])} as a canary taking "
            f"{canary:g}% of calls (version {fn['version']} keeps the rest); "
            f"`thaw canary status {fn['name']}` compares them"
        )
        return
    out.print(f"deployed {fn['name']} version {fn['version']} (bundle {pushed.digest[:19]}…)")
    if spec.llm is not None:
        out.print(
            f"an LLM function: model {fn['name']!r} at {settings.server_url}/openai/v1 "
            "(chat/completions, completions, models)",
            soft_wrap=True,
        )


@app.command("ls")
def ls() -> None:
    """Every function: its active version, model, device, scaling span, live
    replicas, calls so far and warm/cold median latency, and its health (a function
    whose replicas keep failing to start shows "failing")."""
    with client(Settings()) as c:
        fns = check(c.get("/v1/functions"))
        stats = _stats(c)
    table = Table(
        "name",
        "version",
        "model",
        "device",
        "replicas (min..max)",
        "live",
        "calls",
        "p50 warm / cold",
        "health",
    )
    for f in fns:
        spec = f["spec"] or {}
        scaling = spec.get("scaling", {})
        span = f"{scaling.get('min_replicas', '')}..{scaling.get('max_replicas', '')}"
        st = stats.get(f["name"])
        table.add_row(
            f["name"],
            str(f["version"]),
            spec.get("model") or "",
            spec.get("device", ""),
            span,
            _live(st),
            "" if st is None else f"{st['calls']} ({st['calls_failed']} failed)",
            _medians(st),
            health.cell(f),
        )
    out.print(table)


def _stats(c: httpx.Client) -> dict[str, dict[str, Any]]:
    """Per-function stats by name; none for a key without the deploy scope."""
    r = c.get("/v1/stats/functions")
    if r.status_code == 403:
        return {}
    return {s["name"]: s for s in check(r)}


def _live(st: dict[str, Any] | None) -> str:
    if st is None:
        return ""
    live = {k: n for k, n in st["replicas"].items() if n and k in ("ready", "starting", "pending")}
    return ", ".join(f"{n} {state}" for state, n in sorted(live.items())) or "0"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms" if value >= 10 else f"{value:.1f} ms"


def _medians(st: dict[str, Any] | None) -> str:
    if st is None:
        return ""
    return f"{_ms(st['warm']['p50_ms'])} / {_ms(st['cold']['p50_ms'])}"


@app.command("show")
def show(name: str) -> None:
    """A function's record (spec, versions, canary, health) as JSON, then its live
    replicas and recent latency: warm and cold p50/p95 and the median cold start's
    phases."""
    with client(Settings()) as c:
        fn = check(c.get(f"/v1/functions/{name}"))
        r = c.get(f"/v1/functions/{name}/stats")
        st = check(r) if r.status_code != 403 else None
    print_json(fn)
    if st is not None:
        warm, cold = st["warm"], st["cold"]
        out.print(
            f"replicas: {_live(st)}; calls: {st['calls']} ({st['calls_failed']} failed); "
            f"warm p50 {_ms(warm['p50_ms'])}, p95 {_ms(warm['p95_ms'])}; "
            f"cold p50 {_ms(cold['p50_ms'])}, p95 {_ms(cold['p95_ms'])}",
            soft_wrap=True,
        )
        phases = st.get("phase_medians_ms") or {}
        if phases:
            out.print(
                "cold start phases (medians): "
                + ", ".join(f"{k} {_ms(v)}" for k, v in phases.items()),
                soft_wrap=True,
            )
    line = health.note(fn)
    if line is not None:
        err.print(line, soft_wrap=True)


@app.command("rm")
def rm(name: str) -> None:
    """Delete a function and all its versions; its unfinished calls are cancelled."""
    with client(Settings()) as c:
        check(c.delete(f"/v1/functions/{name}"))
    out.print(f"deleted {name}")


@app.command("rollback")
def rollback(
    name: str,
    version: Annotated[int | None, typer.Option(help="default: the previous version")] = None,
) -> None:
    """Make an earlier version of NAME the active one again (its replicas start as
    needed; calls already accepted keep the version they were accepted on)."""
    with client(Settings()) as c:
        fn = check(c.post(f"/v1/functions/{name}/rollback", json={"version": version}))
    out.print(f"{name} now serves version {fn['version']}")
