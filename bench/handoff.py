"""Hand-off bench: what a token costs to pass from one thread to another, by how the
threads are arranged.

    python bench/handoff.py [--streams 32] [--steps 200] [--trials 5] [--json -|PATH]

An LLM token crosses thaw's processes in hops, and at each hop today one thread
per stream wakes for each token: the replica's router hands a step's tokens to
each call's thread, the agent's reader to each call's thread, the server's
direct-run threads to the event loop. This measures the CPU of such a hop on this
machine, the arrangements alternating trial by trial, each step's tokens handed
over at once and a 2 ms pause between steps (an engine step's rhythm):

- ``a thread per stream``: a producer puts each stream's token in that stream's
  ``queue.SimpleQueue``; the stream's thread wakes, takes it and says so.
- ``one thread for all``: the producer puts the step's tokens, every stream's, in
  one queue; one thread wakes and takes them all.

Reported: CPU microseconds per token (the process's user and system time over the
tokens handed over), medians of the trials, and the ratio.
"""

from __future__ import annotations

import argparse
import queue
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import Column, TableSpec, render_table, write_json

PER_STREAM = "a thread per stream"
ONE_THREAD = "one thread for all"
STEP_GAP_S = 0.002
TIMEOUT_S = 30.0


def per_stream(streams: int, steps: int) -> float:
    """CPU microseconds per token with a thread per stream."""
    inboxes: list[queue.SimpleQueue[int]] = [queue.SimpleQueue() for _ in range(streams)]
    taken = threading.Semaphore(0)

    def reader(inbox: queue.SimpleQueue[int]) -> None:
        for _ in range(steps):
            inbox.get(timeout=TIMEOUT_S)
            taken.release()

    threads = [threading.Thread(target=reader, args=(inbox,)) for inbox in inboxes]
    for thread in threads:
        thread.start()

    def step(i: int) -> None:
        for inbox in inboxes:
            inbox.put(i)
        for _ in inboxes:
            taken.acquire(timeout=TIMEOUT_S)

    spent = _timed(step, steps) / (streams * steps)
    for thread in threads:
        thread.join()
    return spent


def one_thread(streams: int, steps: int) -> float:
    """CPU microseconds per token with one thread taking every stream's."""
    inbox: queue.SimpleQueue[list[int]] = queue.SimpleQueue()
    taken = threading.Semaphore(0)
    got = 0

    def reader() -> None:
        nonlocal got
        for _ in range(steps):
            got += len(inbox.get(timeout=TIMEOUT_S))
            taken.release()

    thread = threading.Thread(target=reader)
    thread.start()

    def step(i: int) -> None:
        inbox.put([i] * streams)
        taken.acquire(timeout=TIMEOUT_S)

    spent = _timed(step, steps) / (streams * steps)
    thread.join()
    if got != streams * steps:
        raise RuntimeError(f"one thread took {got} tokens of {streams * steps}")
    return spent


def _timed(step: Callable[[int], None], steps: int) -> float:
    """CPU microseconds of ``steps`` steps, the pauses between them included."""
    started = time.process_time()
    for i in range(steps):
        step(i)
        time.sleep(STEP_GAP_S)
    return (time.process_time() - started) * 1e6


ARRANGEMENTS: dict[str, Callable[[int, int], float]] = {
    PER_STREAM: per_stream,
    ONE_THREAD: one_thread,
}


def run(streams: int, steps: int, trials: int) -> dict[str, Any]:
    """Every arrangement's CPU per token, its trials alternated."""
    spent: dict[str, list[float]] = {name: [] for name in ARRANGEMENTS}
    for _ in range(trials):
        for name, arrangement in ARRANGEMENTS.items():
            spent[name].append(arrangement(streams, steps))
    medians = {name: statistics.median(us) for name, us in spent.items()}
    return {
        "streams": streams,
        "steps": steps,
        "trials": trials,
        "us_per_token": spent,
        "median_us_per_token": medians,
        "ratio": medians[PER_STREAM] / max(medians[ONE_THREAD], 1e-9),
    }


def table(doc: dict[str, Any]) -> TableSpec:
    medians = doc["median_us_per_token"]
    rows = [
        [name, f"{us:.1f}", f"{us / medians[ONE_THREAD]:.1f}" if medians[ONE_THREAD] else "-"]
        for name, us in medians.items()
    ]
    title = (
        f"A token handed between threads: {doc['streams']} streams, {doc['steps']} steps,"
        f" medians of {doc['trials']}"
    )
    columns = [Column("arrangement", "left"), Column("CPU us a token"), Column("x one thread")]
    return TableSpec(title, columns, rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--streams", type=int, default=32)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--json", help="write the figures as JSON to PATH, or - for stdout")
    args = p.parse_args(argv)
    if min(args.streams, args.steps, args.trials) < 1:
        p.error("--streams, --steps and --trials must be at least 1")
    console = Console(stderr=args.json == "-")
    doc = run(args.streams, args.steps, args.trials)
    render_table(table(doc), console)
    if args.json:
        write_json(doc, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
