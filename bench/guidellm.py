"""guidellm beside ``thaw loadtest``: one LLM function, one load, measured by both.

    python bench/guidellm.py [--model DIR] [--quick] [--concurrency 1,4] [--seconds 30]
                             [--prompt-tokens 64] [--output-tokens 32] [--rounds 3]
                             [--venv PATH] [--json -|PATH] [--markdown]
    python bench/guidellm.py --url URL --function NAME --model DIR ...   (a running thaw)

guidellm (vLLM's load generator) runs from its own virtual environment, made on the
first run from ``bench/guidellm-requirements.txt`` (guidellm pinned, torch pinned to
the project's CPU build) under ``bench/.data/guidellm-venv``. Without ``--url`` the
function is a private thaw serving the model (``bench._llm_stack``, one warm
replica), as ``bench/llm.py`` does.

Both tools get the same load: a closed loop of N streams on
``/openai/v1/completions``, prompts of ``--prompt-tokens`` tokens of the model's
tokenizer, every request made to run ``--output-tokens`` tokens (vLLM's
``ignore_eos``; guidellm always sends it, ``thaw loadtest --ignore-eos``). guidellm
makes its own synthetic prompts; ``thaw loadtest`` gets prompts cut to the same
token count. Each round runs both, one after the other (the order alternates), for
``--seconds``; every figure is the median over rounds, as each tool reports it:

    TTFT p50/p99   guidellm time_to_first_token_ms; loadtest ttft_ms
    TPOT p50/p99   guidellm inter_token_latency_ms ((end - first) / (tokens - 1),
                   per request); loadtest tpot_ms (the same definition)
    tokens/s       guidellm's output tokens per second; loadtest output_tokens_per_s

and ``x lt`` is guidellm's figure over thaw loadtest's. Beside each tool, the same
medians as the server recorded them for that tool's calls (``server TTFT``: the
replica's, from the call's start there; ``server TPOT``): where the tools disagree
and the server's figures do too, the load differed (each client spends CPU on the
same cores as the server), not the measuring.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console

from bench._common import (
    REPO_ROOT,
    Column,
    TableSpec,
    machine_description,
    markdown_table,
    render_table,
    write_json,
)

REQUIREMENTS = Path(__file__).resolve().parent / "guidellm-requirements.txt"
DEFAULT_VENV = Path(__file__).resolve().parent / ".data" / "guidellm-venv"
GUIDELLM = "guidellm"
LOADTEST = "thaw loadtest"
FIGURES = ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "tokens_per_s")
SERVER_FIGURES = ("server_ttft_p50", "server_tpot_p50")
RUN_SLACK_S = 240  # a tool's start, the drain of its last streams, its report
WORDS = (
    "a cold start is the first request after idle and every millisecond of it is counted "
    "stored streamed verified and shown in order so the weights reach the device while "
    "the replica imports its code and the caller waits on the stream"
)


class BenchError(RuntimeError):
    """A tool could not run; the message says which and why."""


# --- guidellm's environment ----------------------------------------------------------
def ensure_venv(venv: Path, say: Callable[[str], None]) -> Path:
    """The ``guidellm`` executable of ``venv``, made from the requirements file on the
    first run (pip's progress is shown)."""
    exe = venv / "bin" / "guidellm"
    if exe.is_file():
        return exe
    say(f"making guidellm's environment in {venv} (once) …")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "pip"), "install", "--progress-bar", "on", "-r", str(REQUIREMENTS)]
    if subprocess.run(pip).returncode != 0 or not exe.is_file():
        raise BenchError(f"pip could not install {REQUIREMENTS} into {venv}")
    return exe


# --- the loads -------------------------------------------------------------------------
@dataclass(frozen=True)
class Load:
    url: str  # the server's base URL (no /openai)
    key: str
    function: str
    model_dir: Path  # its tokenizer makes and counts the prompts
    concurrency: int
    prompt_tokens: int
    output_tokens: int
    seconds: float


def prompts_file(model_dir: Path, tokens: int, path: Path, n: int = 64) -> Path:
    """``n`` prompts of exactly ``tokens`` tokens (as the server's tokenizer counts
    them, special tokens included), one JSON object a line, for ``thaw loadtest``."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rng = random.Random(0)
    lines: list[str] = []
    while len(lines) < n:
        text = " ".join(rng.choice(WORDS.split()) for _ in range(tokens * 2))
        ids = tokenizer(text)["input_ids"]
        for cut in range(tokens, 0, -1):
            prompt = tokenizer.decode(ids[:cut], skip_special_tokens=True)
            if len(tokenizer(prompt)["input_ids"]) == tokens:
                lines.append(json.dumps({"prompt": prompt}))
                break
        else:
            raise BenchError(f"no text of {tokens} tokens could be made with this tokenizer")
    path.write_text("\n".join(lines) + "\n")
    return path


def run_guidellm(exe: Path, load: Load, out: Path) -> dict[str, Any]:
    """One guidellm run (a closed loop of ``load.concurrency`` streams); its figures."""
    backend = ",".join(
        [
            "kind=openai_http",
            f"target={load.url}/openai",
            f"model={load.function}",
            f"api_key={load.key}",
            "request_format=/v1/completions",
            "validate_backend=false",
        ]
    )
    data = f"kind=synthetic_text,prompt_tokens={load.prompt_tokens}"
    argv = [
        str(exe), "run",
        "--backend", backend,
        "--profile", f"kind=concurrent,streams={load.concurrency}",
        "--data", f"{data},output_tokens={load.output_tokens}",
        "--tokenizer", f"kind=huggingface_auto,model={load.model_dir}",
        "--constraint", f"kind=max_duration,seconds={load.seconds:g}",
        "--output", f"kind=json,path={out}",
    ]  # fmt: skip
    env = {**os.environ, "GUIDELLM__MAX_WORKER_PROCESSES": "1", "HF_HUB_OFFLINE": "1"}
    done = _run(argv, env, load.seconds, "guidellm")
    if not out.is_file():
        raise BenchError(f"guidellm wrote no results: {done.stdout[-2000:]}")
    return guidellm_figures(json.loads(out.read_text()))


def run_loadtest(load: Load, prompts: Path) -> dict[str, Any]:
    """One ``thaw loadtest`` run on the same load, as a user runs it; its figures."""
    argv = [
        sys.executable, "-m", "cli.main", "loadtest", load.function,
        "--concurrency", str(load.concurrency), "--duration-s", f"{load.seconds:g}",
        "--endpoint", "completions", "--prompts", str(prompts),
        "--max-tokens", str(load.output_tokens), "--ignore-eos", "--json",
    ]  # fmt: skip
    env = {**os.environ, "THAW_SERVER_URL": load.url, "THAW_API_KEY": load.key}
    done = _run(argv, env, load.seconds, "thaw loadtest")
    return loadtest_figures(json.loads(done.stdout))


def _run(
    argv: list[str], env: dict[str, str], seconds: float, name: str
) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(
            argv,
            env=env,
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=seconds + RUN_SLACK_S,
        )
    except subprocess.TimeoutExpired:
        raise BenchError(f"{name} ran past {seconds + RUN_SLACK_S:.0f} s") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout)[-2000:]
        raise BenchError(f"{name} exited {done.returncode}: {tail}")
    return done


# --- reading each tool's report ----------------------------------------------------------
def guidellm_figures(doc: dict[str, Any]) -> dict[str, Any]:
    """The figures of guidellm's JSON report (its one benchmark, completed requests)."""
    benchmarks = doc.get("benchmarks") or []
    if len(benchmarks) != 1:
        raise BenchError(f"expected one guidellm benchmark, found {len(benchmarks)}")
    metrics = benchmarks[0]["metrics"]

    def stat(name: str, which: str = "successful") -> dict[str, Any]:
        return dict(metrics[name][which])

    ttft, itl = stat("time_to_first_token_ms"), stat("inter_token_latency_ms")
    totals = metrics["request_totals"]
    return {
        "ttft_p50": ttft["percentiles"]["p50"],
        "ttft_p99": ttft["percentiles"]["p99"],
        "tpot_p50": itl["percentiles"]["p50"],
        "tpot_p99": itl["percentiles"]["p99"],
        "tokens_per_s": stat("output_tokens_per_second", "total")["mean"],
        "requests": int(totals["successful"]),
        "errors": int(totals["errored"]),
        "prompt_tokens": stat("prompt_token_count")["mean"],
        "output_tokens": stat("output_token_count")["mean"],
    }


def loadtest_figures(doc: dict[str, Any]) -> dict[str, Any]:
    """The same figures of ``thaw loadtest --json``."""
    calls = int(doc["ok"])
    if not doc.get("llm") or calls == 0:
        raise BenchError(f"thaw loadtest made no LLM call: {doc.get('error_examples')}")
    return {
        "ttft_p50": doc["ttft_ms"]["p50"],
        "ttft_p99": doc["ttft_ms"]["p99"],
        "tpot_p50": doc["tpot_ms"]["p50"],
        "tpot_p99": doc["tpot_ms"]["p99"],
        "tokens_per_s": doc["output_tokens_per_s"],
        "requests": calls,
        "errors": int(doc["errors"]),
        "prompt_tokens": doc["prompt_tokens"] / calls,
        "output_tokens": doc["completion_tokens"] / calls,
    }


def server_figures(load: Load, since: float, until: float) -> dict[str, Any]:
    """Medians of the replica's TTFT and TPOT over the calls the server accepted
    between ``since`` and ``until`` (wall clock): the calls of one run."""
    import httpx

    headers = {"Authorization": f"Bearer {load.key}"}
    params: dict[str, Any] = {"function": load.function, "limit": 500}
    with httpx.Client(base_url=load.url, headers=headers, timeout=60) as c:
        r = c.get("/v1/calls", params=params)
        r.raise_for_status()
    timings = [
        call.get("timings_ms") or {}
        for call in r.json()
        if since <= call["accepted_at"] <= until and call["status"] == "succeeded"
    ]
    done = [t for t in timings if "ttft" in t and "tpot" in t]
    if not done:
        raise BenchError(f"the server recorded no finished call of the run on {load.function}")
    return {
        "server_ttft_p50": statistics.median(t["ttft"] for t in done),
        "server_tpot_p50": statistics.median(t["tpot"] for t in done),
    }


def measured(run_one: Callable[[], dict[str, Any]], load: Load) -> dict[str, Any]:
    """One tool's run, with the server's own figures for its calls."""
    since = time.time()
    figures = run_one()
    return {**figures, **server_figures(load, since, time.time())}


def level_rows(concurrency: int, rounds: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per tool at a level: medians over rounds, and guidellm over loadtest."""
    rows = []
    for tool, runs in rounds.items():
        row: dict[str, Any] = {"tool": tool, "concurrency": concurrency, "rounds": len(runs)}
        for key in (*FIGURES, *SERVER_FIGURES, "prompt_tokens", "output_tokens"):
            row[key] = statistics.median(r[key] for r in runs)
        row["requests"] = sum(r["requests"] for r in runs)
        row["errors"] = sum(r["errors"] for r in runs)
        rows.append(row)
    ours = next(r for r in rows if r["tool"] == LOADTEST)
    for row in rows:
        row["ratio"] = {k: row[k] / ours[k] if ours[k] else None for k in FIGURES}
    return rows


# --- the run -----------------------------------------------------------------------------
@contextmanager
def _server(args: argparse.Namespace, model_dir: Path, tmp: Path) -> Iterator[tuple[str, str]]:
    """(base URL, key) of the thaw to measure: ``--url``, or a private one."""
    if args.url:
        yield args.url.rstrip("/"), args.key
        return
    from bench._llm_stack import FUNCTION, installation

    args.function = FUNCTION
    sizes = {"max_num_seqs": 32, "max_batch_tokens": 512, "kv_cache_mb": 256}
    with installation(model_dir, tmp, sizes, max(args.concurrency), narrow=False) as stack:
        yield stack.url, stack.admin_key


def run(args: argparse.Namespace, say: Callable[[str], None]) -> dict[str, Any]:
    from bench.llm import check_model_dir, model_dir_of

    model_dir = model_dir_of(args)
    if (why := check_model_dir(model_dir)) is not None:
        raise SystemExit(f"--model: {why}")
    exe = ensure_venv(args.venv, say)
    rows = []
    with tempfile.TemporaryDirectory(prefix="thaw-bench-guidellm-") as tmp_dir:
        tmp = Path(tmp_dir)
        prompts = prompts_file(model_dir, args.prompt_tokens, tmp / "prompts.jsonl")
        say(f"serving {model_dir} …" if not args.url else f"measuring {args.url} …")
        with _server(args, model_dir, tmp / "thaw") as (url, key):
            for n in args.concurrency:
                load = Load(
                    url, key, args.function, model_dir, n,
                    args.prompt_tokens, args.output_tokens, args.seconds,
                )  # fmt: skip
                runs: dict[str, list[dict[str, Any]]] = {GUIDELLM: [], LOADTEST: []}
                for i in range(args.rounds):
                    order = [GUIDELLM, LOADTEST] if i % 2 == 0 else [LOADTEST, GUIDELLM]
                    for tool in order:
                        say(f"{n} streams, round {i + 1}/{args.rounds}: {tool} …")
                        out = tmp / f"gl-{n}-{i}.json"
                        one = (
                            partial(run_guidellm, exe, load, out)
                            if tool == GUIDELLM
                            else partial(run_loadtest, load, prompts)
                        )
                        runs[tool].append(measured(one, load))
                rows += level_rows(n, runs)
    return {
        "machine": machine_description(),
        "model": str(model_dir),
        "function": args.function,
        "prompt_tokens": args.prompt_tokens,
        "output_tokens": args.output_tokens,
        "seconds": args.seconds,
        "rounds": args.rounds,
        "rows": rows,
    }


def table(doc: dict[str, Any]) -> TableSpec:
    title = (
        f"guidellm beside thaw loadtest: {doc['model']}, {doc['prompt_tokens']} prompt and "
        f"{doc['output_tokens']} output tokens, {doc['seconds']:g} s runs, "
        f"medians of {doc['rounds']}"
    )
    headers = ["streams", "tool", "requests", "TTFT p50 ms", "x lt", "TTFT p99 ms"]
    headers += ["TPOT p50 ms", "x lt", "TPOT p99 ms", "tokens/s", "x lt", "prompt / output"]
    headers += ["server TTFT p50", "server TPOT p50"]
    columns = [Column(h, justify="left" if h == "tool" else "right") for h in headers]
    rows = []
    for r in doc["rows"]:

        def ratio(key: str, r: dict[str, Any] = r) -> str:
            return "" if r["tool"] == LOADTEST else f"{r['ratio'][key]:.2f}"

        rows.append(
            [
                str(r["concurrency"]),
                r["tool"],
                str(r["requests"]),
                f"{r['ttft_p50']:.0f}",
                ratio("ttft_p50"),
                f"{r['ttft_p99']:.0f}",
                f"{r['tpot_p50']:.1f}",
                ratio("tpot_p50"),
                f"{r['tpot_p99']:.1f}",
                f"{r['tokens_per_s']:.1f}",
                ratio("tokens_per_s"),
                f"{r['prompt_tokens']:.0f} / {r['output_tokens']:.0f}",
                f"{r['server_ttft_p50']:.0f}",
                f"{r['server_tpot_p50']:.1f}",
            ]
        )
    caption = "x lt: guidellm's figure over thaw loadtest's on the same load"
    return TableSpec(title, columns, rows, caption)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", help="a model directory (default: the bench's example model)")
    p.add_argument("--quick", action="store_true", help="the tiny example model, short runs")
    p.add_argument("--concurrency", default="1,4", help="closed-loop streams, per level")
    p.add_argument("--seconds", type=float, default=30.0, help="each run's length")
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--output-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--venv", type=Path, default=DEFAULT_VENV, help="guidellm's environment")
    p.add_argument("--url", help="measure a running thaw instead of a private one")
    p.add_argument("--function", default="chat", help="with --url: the LLM function")
    p.add_argument("--key", default=os.environ.get("THAW_API_KEY"))
    p.add_argument("--data-dir", type=Path, default=Path(__file__).resolve().parent / ".data")
    p.add_argument("--json", dest="json_out", help="also write the figures as JSON (- for stdout)")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    args = p.parse_args(argv)
    try:
        args.concurrency = [int(s) for s in args.concurrency.split(",")]
    except ValueError:
        p.error(f"--concurrency takes numbers separated by commas, not {args.concurrency!r}")
    if not args.concurrency or min(args.concurrency) < 1:
        p.error("--concurrency must be positive")
    if args.rounds < 1 or args.seconds <= 0 or min(args.prompt_tokens, args.output_tokens) < 2:
        p.error("--rounds and --seconds must be positive, --prompt/--output-tokens at least 2")
    if args.url and not (args.key and args.model):
        p.error("--url needs --key (or THAW_API_KEY) and --model (its tokenizer)")
    if args.quick:
        args.seconds = min(args.seconds, 8.0)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    err = Console(stderr=True)
    try:
        doc = run(args, lambda line: err.print(line, style="dim"))
    except BenchError as exc:
        err.print(f"[red]{exc}[/red]")
        return 1
    spec = table(doc)
    if args.markdown:
        print(f"**{spec.title}**\n\n{markdown_table(spec)}\n")
    else:
        render_table(spec, Console(width=None if sys.stdout.isatty() else 220))
    if args.json_out:
        write_json(doc, args.json_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
