"""Prompt-prefix KV reuse against none, on one model with LoRA adapters, in this process:

    python bench/llm_prefix.py [--model DIR] [--quick] [--adapters 4] [--system-tokens 192]
                               [--streams 1,8] [--rounds 5] [--max-tokens 16]
                               [--max-num-seqs 32 --max-batch-tokens 512 --kv-cache-mb 256]
                               [--json -|PATH]

Two LLM replicas as thaw's LLM functions run them (``worker.llm.serve.LLMReplica``) on
the same model and the same adapters, mixed in one batch, side by side in this process:

    reused            ``prefix_caching = true`` (the default): a prompt's KV blocks
                      already in the cache, made through the same adapter load, are
                      taken as they are (``worker.llm.prefix``)
    prefilled         ``prefix_caching = false``: every prompt is computed whole

Each adapter stands for a tenant with a system prompt of its own, ``--system-tokens``
tokens long; a request is its adapter's system prompt and one of ``QUESTIONS``. At each
level, ``streams`` requests at once, a thread each, request ``i`` of a round through
adapter ``i % --adapters`` with question ``i``, seed ``i``, temperature 1,
``--max-tokens`` tokens. Before the levels every adapter's system prompt has been sent
once (a tenant's first call), so the reused replica holds them, as it does in service.
The two replicas take turns round by round; every figure is the median over rounds.
TTFT is to the first text, as a client sees it. Then each adapter's greedy answer to
one question, through both: the table says how many are the same (a block reused
across adapters would change them).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console

from bench import _llm_baselines as base
from bench._common import Column, TableSpec, machine_description, render_table, write_json
from bench.llm import level_row, model_dir_of, sizes_of
from bench.llm_adapters import at_once, build_adapters, replica

REUSED = "reused"
PREFILLED = "prefilled"
MODES = (REUSED, PREFILLED)
GREEDY_TOKENS = 16
QUESTIONS = [
    " Where did my cold start go?",
    " How many tokens a second?",
    " Why is the first call slow?",
    " Which adapter am I talking to?",
    " What does a replica cost idle?",
    " Can two tenants share a batch?",
    " When does the cache evict?",
    " Who pays for the prefill?",
]
SYSTEM = (
    "You are the support assistant of tenant {k}. Answer briefly and politely, cite the"
    " runbook section you used, never guess a number, and say so when you do not know. "
)


def system_prompts(llm: Any, count: int, tokens: int) -> list[list[int]]:
    """Each tenant's system prompt: ``tokens`` tokens of its own text."""
    out = []
    for k in range(count):
        text = SYSTEM.format(k=k)
        ids = llm.text_prompt(text * (1 + tokens // max(1, len(llm.text_prompt(text)))))
        out.append(ids[:tokens])
    return out


def question_ids(llm: Any) -> list[list[int]]:
    return [list(llm.tokenizer(q, add_special_tokens=False)["input_ids"]) for q in QUESTIONS]


def level(
    llm: Any, prompts: list[list[int]], names: list[str], streams: int, max_tokens: int
) -> base.Level:
    """``streams`` requests at once, a thread each: request ``i`` is prompt
    ``i % len(prompts)`` through adapter ``i % len(names)``."""
    requests = [(prompts[i % len(prompts)], names[i % len(names)]) for i in range(streams)]
    return at_once(llm, requests, max_tokens)


def greedy(llm: Any, prompt: list[int], name: str) -> str:
    from worker.llm.engine import Sampling

    deltas = llm.stream(prompt, Sampling(max_new_tokens=GREEDY_TOKENS), None, name)
    return "".join(d.text for d in deltas)


def run(args: argparse.Namespace) -> dict[str, Any]:
    model_dir, sizes = model_dir_of(args), sizes_of(args)
    out = args.data_dir / f"adapters-{model_dir.parent.name}-{model_dir.name}-{args.adapters}"
    adapter_dirs = build_adapters(model_dir, out, args.adapters)
    with (
        replica(model_dir, adapter_dirs, sizes, True, prefix_caching=True) as reused,
        replica(model_dir, adapter_dirs, sizes, True, prefix_caching=False) as prefilled,
    ):
        figures = measure({REUSED: reused, PREFILLED: prefilled}, args)
    return {
        "model": str(model_dir),
        "adapters": args.adapters,
        "system_tokens": args.system_tokens,
        "max_tokens": args.max_tokens,
        "sizes": sizes,
        **figures,
    }


def measure(replicas: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Each tenant's first call, each level's rounds (the modes taking turns), then the
    greedy agreement."""
    reused = replicas[REUSED]
    names = list(reused.adapters)
    systems = system_prompts(reused, len(names), args.system_tokens)
    questions = question_ids(reused)
    # Prompt j: tenant j % adapters' system prompt; through adapter j % adapters.
    prompts = [
        systems[j % len(names)] + questions[j % len(questions)]
        for j in range(math.lcm(len(names), len(questions)))
    ]
    for llm in replicas.values():
        level(llm, prompts[: len(names)], names, len(names), 2)  # each tenant's first call
    rows = []
    for streams in args.streams:
        rounds: dict[str, list[base.Level]] = {m: [] for m in MODES}
        for n in range(args.rounds):
            shifted = prompts[n % len(prompts) :] + prompts[: n % len(prompts)]
            turn = names[n % len(names) :] + names[: n % len(names)]
            for mode in MODES if n % 2 == 0 else MODES[::-1]:
                rounds[mode].append(level(replicas[mode], shifted, turn, streams, args.max_tokens))
        for mode in MODES:
            rows.append({"mode": mode, **level_row(streams, rounds[mode], math.inf, math.inf)})
        print(f"{streams} streams: done", file=sys.stderr, flush=True)
    texts = {
        mode: [greedy(llm, prompts[k], names[k]) for k in range(len(names))]
        for mode, llm in replicas.items()
    }
    same = sum(a == b for a, b in zip(texts[REUSED], texts[PREFILLED], strict=True))
    engine = reused.engine
    return {
        "prompt_tokens": statistics.median(len(p) for p in prompts),
        # Of the prompt tokens the reused replica looked up, the share found cached.
        "hit_share": engine.prefix_hit_tokens / max(1, engine.prefix_queried_tokens),
        "prefilled_lookups": replicas[PREFILLED].engine.prefix_queried_tokens,
        "greedy_same": same,
        "greedy_distinct": len(set(texts[PREFILLED])),
        "rows": rows,
    }


def table(result: dict[str, Any]) -> TableSpec:
    prefilled = {r["streams"]: r for r in result["rows"] if r["mode"] == PREFILLED}
    heads = [
        "mode",
        "streams",
        "TTFT p50 ms",
        "x prefilled",
        "TTFT p99 ms",
        "tokens/s",
        "TPOT p50 ms",
    ]
    body = []
    for r in result["rows"]:
        other = prefilled[r["streams"]]
        body.append(
            [
                r["mode"],
                str(r["streams"]),
                f"{r['ttft_p50_ms']:.1f}",
                f"{r['ttft_p50_ms'] / other['ttft_p50_ms']:.2f}",
                f"{r['ttft_p99_ms']:.1f}",
                f"{r['tokens_per_s']:.1f}",
                f"{r['tpot_p50_ms']:.2f}",
            ]
        )
    n, model = result["adapters"], Path(result["model"])
    title = (
        f"{model.parent.name}/{model.name}: {n} adapters, each with a system prompt of"
        f" {result['system_tokens']} tokens (prompts {result['prompt_tokens']:g} tokens),"
        f" {result['max_tokens']} tokens a stream, medians over rounds; prompt tokens"
        f" found cached: {result['hit_share']:.0%}; greedy answers"
        f" reused = prefilled: {result['greedy_same']} of {n}"
        f" ({result['greedy_distinct']} distinct)"
    )
    return TableSpec(title, [Column(h) for h in heads], body)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", help="a model directory (default: the bench's example model)")
    p.add_argument("--quick", action="store_true", help="the tiny example model")
    p.add_argument("--adapters", type=int, default=4)
    p.add_argument("--system-tokens", type=int, default=192)
    p.add_argument("--streams", default="1,8")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--max-batch-tokens", type=int, default=512)
    p.add_argument("--kv-cache-mb", type=int, default=256)
    p.add_argument("--data-dir", type=Path, default=Path(__file__).resolve().parent / ".data")
    p.add_argument("--json", dest="json_out", help="also write the figures as JSON (- for stdout)")
    args = p.parse_args(argv)
    args.streams = [int(s) for s in args.streams.split(",")]
    if args.rounds < 1 or args.adapters < 1 or args.system_tokens < 1:
        p.error("--rounds, --adapters and --system-tokens must be at least 1")
    result = run(args)
    render_table(table(result), Console(width=None if sys.stdout.isatty() else 200))
    if args.json_out:
        write_json({"machine": machine_description(), **result}, args.json_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
