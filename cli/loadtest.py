"""``thaw loadtest NAME``: drive a function and report its tail latency.

    thaw loadtest NAME --concurrency 16 --duration-s 30
    thaw loadtest NAME --rate 50 --arrival poisson|constant|bursty [--idle-gap-s 20]
                  [--data JSON] [--stream] [--json] [--png PATH] [--seed N]
    thaw loadtest LLM[:ADAPTER] --concurrency 8 [--max-tokens 64] [--prompts FILE]
                  [--endpoint chat|completions] [--slo-ttft-ms 500] [--slo-tpot-ms 50]

Reports p50/p90/p95/p99 of total latency and time to first output, cold and
warm calls apart (``X-Thaw-Cold``), errors, throughput, and queue depth over
time (sampled from ``/metrics``, which needs an admin key). A function the
OpenAI routes serve (an LLM function) is driven through them, streamed: the
report is then TTFT and TPOT percentiles, output tokens/s and goodput, the
share of calls within ``--slo-ttft-ms`` and ``--slo-tpot-ms``. How calls are
sent is described in :mod:`cli.loadtest_run` and :mod:`cli.loadtest_llm`; the
schedules in :mod:`cli.loadtest_schedule`.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.live import Live
from rich.text import Text

from cli.control import fail
from cli.loadtest_llm import (
    PROMPTS,
    Endpoint,
    LlmLoad,
    LlmLoadError,
    load_prompts,
    resolve_cold,
    served_models,
)
from cli.loadtest_report import llm_table, results_table, summarize, write_png
from cli.loadtest_run import Recorder, Target, drive, http_client, run_closed, run_open
from cli.loadtest_schedule import Arrival, ScheduleError, arrivals
from cli.report import percentile, render_table
from control_plane.settings import Settings

PROGRESS_INTERVAL_S = 0.5


def _input(data: str) -> Any:
    try:
        return json.loads(data)
    except json.JSONDecodeError as exc:
        raise fail(f"--data is not JSON: {exc}") from None


def _progress_line(rec: Recorder, duration_s: float) -> Text:
    done, errors, in_flight = rec.snapshot()
    with rec.lock:
        recent = [c.latency_s for c in rec.calls[-200:] if c.ok]
        ttfts = [c.ttft_s for c in rec.calls[-200:] if c.ok and c.ttft_s is not None]
        tokens = sum(c.completion_tokens or 0 for c in rec.calls)
    p50 = f"{percentile(recent, 50) * 1000:.0f} ms" if recent else "-"
    elapsed = min(rec.now_s(), duration_s)
    line = (
        f"{elapsed:5.1f}/{duration_s:g} s  calls {done}  errors {errors}  "
        f"in flight {in_flight}  recent p50 {p50}"
    )
    if tokens:
        ttft = f"{percentile(ttfts, 50) * 1000:.0f} ms" if ttfts else "-"
        line += f"  TTFT p50 {ttft}  tokens {tokens} ({tokens / max(rec.now_s(), 1e-9):.0f}/s)"
    return Text(line, style="dim")


def _run_with_progress(
    target: Target, load: Any, duration_s: float, queue_interval_s: float, console: Console
) -> Recorder:
    rec = Recorder()
    runner = threading.Thread(target=drive, args=(target, load, queue_interval_s, rec))
    runner.start()
    with Live(_progress_line(rec, duration_s), console=console, transient=True) as live:
        while runner.is_alive():
            runner.join(timeout=PROGRESS_INTERVAL_S)
            live.update(_progress_line(rec, duration_s))
    return rec


def loadtest(
    name: str,
    concurrency: Annotated[
        int | None, typer.Option(min=1, help="closed loop: this many clients back to back")
    ] = None,
    rate: Annotated[
        float | None, typer.Option(min=0.0, help="open loop: calls per second (with --arrival)")
    ] = None,
    arrival: Annotated[
        str, typer.Option(help="constant | poisson | bursty (with --rate)")
    ] = "poisson",
    idle_gap_s: Annotated[float, typer.Option(help="bursty: seconds without calls")] = 10.0,
    burst_s: Annotated[float, typer.Option(help="bursty: seconds of each burst")] = 5.0,
    duration_s: Annotated[float, typer.Option(min=0.1, help="how long to send calls")] = 30.0,
    data: Annotated[str, typer.Option("--data", "-d", help="every call's input (JSON)")] = "null",
    stream: Annotated[bool, typer.Option(help="server-sent events; TTFT = first output")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="print the summary as JSON")] = False,
    png: Annotated[Path | None, typer.Option(help="write a chart (latency, queue)")] = None,
    seed: Annotated[int, typer.Option(help="seed of the arrival schedule")] = 0,
    max_in_flight: Annotated[int, typer.Option(min=1, help="open loop: client threads")] = 256,
    queue_interval_s: Annotated[float, typer.Option(help="queue depth sampling")] = 0.5,
    prompt: Annotated[
        list[str] | None, typer.Option(help="LLM: a prompt (repeat for several)")
    ] = None,
    prompts: Annotated[
        Path | None, typer.Option(help='LLM: prompts, one a line or JSON lines {"prompt": ...}')
    ] = None,
    max_tokens: Annotated[int, typer.Option(min=1, help="LLM: tokens each call asks for")] = 64,
    endpoint: Annotated[str, typer.Option(help="LLM: chat | completions")] = "chat",
    temperature: Annotated[float, typer.Option(min=0.0, help="LLM: sampling temperature")] = 1.0,
    ignore_eos: Annotated[
        bool, typer.Option(help="LLM: every call makes --max-tokens tokens, past end of text")
    ] = False,
    slo_ttft_ms: Annotated[
        float | None, typer.Option(min=0.0, help="LLM goodput: time to first token at most")
    ] = None,
    slo_tpot_ms: Annotated[
        float | None, typer.Option(min=0.0, help="LLM goodput: time per output token at most")
    ] = None,
) -> None:
    """Drive a function at a concurrency or an arrival rate; report its latency tail
    (on an LLM function: TTFT, TPOT, tokens/s and goodput)."""
    if (concurrency is None) == (rate is None):
        raise fail("give exactly one of --concurrency N (closed loop) or --rate R (open loop)")
    settings = Settings()
    if not settings.api_key:
        raise fail("no API key: set THAW_API_KEY (an admin key also lets it sample /metrics)")
    asked = dict(prompt=prompt, prompts=prompts, slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms)
    asked["ignore_eos"] = ignore_eos or None
    llm = _llm_load(
        Target(settings.server_url, settings.api_key, name),
        [f"--{k.replace('_', '-')}" for k, v in asked.items() if v is not None],
        LlmLoad(
            name,
            max_tokens=max_tokens,
            endpoint=_endpoint(endpoint),
            temperature=temperature,
            ignore_eos=ignore_eos,
        ),
        prompt,
        prompts,
        data,
    )
    function = name.partition(":")[0] if llm is not None else name
    target = Target(settings.server_url, settings.api_key, function, _input(data), stream, llm=llm)
    params: dict[str, Any] = {"function": function, "duration_s": duration_s, "stream": stream}
    if llm is not None:
        params.update(
            llm=True, model=name, stream=True, endpoint=llm.endpoint, max_tokens=llm.max_tokens
        )
        params["ignore_eos"] = llm.ignore_eos
    if concurrency is not None:
        load = partial(_closed, target, concurrency, duration_s)
        params["concurrency"] = concurrency
    else:
        assert rate is not None
        try:
            schedule = arrivals(
                _arrival(arrival),
                rate,
                duration_s,
                burst_s=burst_s,
                idle_gap_s=idle_gap_s,
                seed=seed,
            )
        except ScheduleError as exc:
            raise fail(str(exc)) from None
        load = partial(_open, target, schedule, max_in_flight)
        params.update(rate_per_s=rate, arrival=arrival, scheduled_calls=len(schedule))
    console = Console(stderr=True)
    started = time.perf_counter()
    rec = _run_with_progress(target, load, duration_s, queue_interval_s, console)
    elapsed_s = time.perf_counter() - started
    if llm is not None:
        _learn_cold(target, rec)
    doc = summarize(rec.calls, rec.queue, elapsed_s, params, slo_ttft_ms, slo_tpot_ms)
    doc["queue_note"] = rec.queue_note
    _report(doc, rec, png, json_out, console)


def _endpoint(value: str) -> Endpoint:
    if value not in ("chat", "completions"):
        raise fail(f"--endpoint {value!r}: choose chat or completions")
    return value  # type: ignore[return-value]


def _llm_load(
    target: Target,
    llm_options: list[str],
    load: LlmLoad,
    prompt: list[str] | None,
    prompts: Path | None,
    data: str,
) -> LlmLoad | None:
    """The LLM load when the OpenAI routes serve ``target.function``, else None; an
    LLM option on a function they do not serve is refused, and so is ``--data`` on
    one they do."""
    try:
        with http_client(target) as c:
            models = served_models(c)
    except httpx.HTTPError as exc:
        raise fail(f"cannot reach {target.server_url}: {exc!r}") from None
    name = target.function
    if models is None or name not in models:
        if ":" in name or llm_options:
            served = ", ".join(models or []) or "none"
            options = " ".join(llm_options)
            what = f"{options} is for LLM functions" if options else "NAME:ADAPTER is"
            raise fail(
                f"{what}, and the OpenAI routes do not serve {name!r} (they serve: {served})"
            )
        return None
    if data != "null":
        raise fail(f"{name} is an LLM function: give --prompt or --prompts, not --data")
    if prompt and prompts is not None:
        raise fail("give --prompt or --prompts, not both")
    try:
        chosen = tuple(prompt) if prompt else load_prompts(prompts) if prompts else PROMPTS
    except LlmLoadError as exc:
        raise fail(str(exc)) from None
    return replace(load, prompts=chosen)


def _learn_cold(target: Target, rec: Recorder) -> None:
    """Cold or warm for streams that began queued (no ``X-Thaw-Cold``): their records."""
    unknown = [c.call_id for c in rec.calls if c.cold is None and c.call_id is not None]
    if not unknown:
        return
    with http_client(target) as c:
        cold = resolve_cold(c, unknown)
    rec.calls = [replace(c, cold=cold[c.call_id]) if c.call_id in cold else c for c in rec.calls]


def _arrival(value: str) -> Arrival:
    if value not in ("constant", "poisson", "bursty"):
        raise fail(f"--arrival {value!r}: choose constant, poisson or bursty")
    return value  # type: ignore[return-value]


def _closed(target: Target, concurrency: int, duration_s: float, rec: Recorder) -> None:
    run_closed(target, concurrency, duration_s, rec)


def _open(target: Target, schedule: list[float], max_in_flight: int, rec: Recorder) -> None:
    run_open(target, schedule, rec, max_in_flight)


def _report(
    doc: dict[str, Any], rec: Recorder, png: Path | None, json_out: bool, console: Console
) -> None:
    if png is not None:
        try:
            write_png(doc, rec.calls, png)
        except RuntimeError as exc:
            raise fail(str(exc)) from None
    if json_out:
        typer.echo(json.dumps(doc, indent=2))
    else:
        render_table(llm_table(doc) if doc.get("llm") else results_table(doc), Console())
        if doc["queue_note"]:
            console.print(f"[yellow]queue depth not sampled: {doc['queue_note']}[/yellow]")
        for example in doc["error_examples"]:
            console.print(f"[red]error:[/red] {example}")
    if png is not None:
        console.print(f"chart: {png}")
