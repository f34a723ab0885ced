"""The replica's side of an LLM stream: chunks pulled by a thread per call, against
chunks pushed by the engine's router a step at a time.

    python bench/replica_push.py [--streams 32] [--tokens 64] [--trials 5] [--json -|PATH]

Runs thaw's LLM function in this process on the example's tiny Llama (its steps
take about a millisecond, so what is measured is the serving work around them, as
on a GPU, where a step is fast and the replica's Python competes with the engine's
loop for the interpreter). ``--streams`` calls at once, each ``--tokens`` tokens
(``ignore_eos``), the two ways alternating trial by trial:

- ``pulled``: each call's thread iterates the function's stream, woken per step,
  and frames each chunk (``worker.replica_child._output_frame``) and writes it, as
  ``ChildServer._collect`` does;
- ``pushed``: each call's thread waits in ``LLMFunction.push_call``; the router
  frames every call's chunk of a step and writes them at once
  (``worker.pushed_calls``).

The frames are written to a socket pair whose other end is drained by a thread, as
the agent reads them. Reported: completion tokens per second and the process's CPU
milliseconds per token, medians of the trials, and the ratios.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

from rich.console import Console

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import Column, TableSpec, render_table, write_json

PULLED, PUSHED = "pulled", "pushed"


def _function(root: Path, streams: int) -> Any:
    from safetensors.torch import load_file

    from control_plane.protocol import LLMOptions
    from examples.build_model import build_model
    from snapshotter.loader import LoadedTensors
    from worker.llm.function import LLMFunction
    from worker.sdk import Context

    model_dir = build_model(root / "model")
    config = json.loads((model_dir / "config.json").read_text())
    weights = LoadedTensors()
    for shard in sorted(model_dir.glob("*.safetensors")):
        weights.update(load_file(shard))
    weights.report = None  # type: ignore[assignment]  # read from files, not the store
    ctx = Context(device="cpu", weights=weights, config=config, files=model_dir)
    options = LLMOptions(max_num_seqs=streams, kv_cache_mb=64, max_tokens_limit=256)
    fn = LLMFunction(options)
    fn.setup(ctx)
    return fn


class _Wire:
    """A socket pair: frames written to one end, the other drained by a thread."""

    def __init__(self) -> None:
        self.out, self._in = socket.socketpair()
        self.lock = threading.Lock()
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def send(self, data: bytes) -> None:
        with self.lock:
            self.out.sendall(data)

    def _drain(self) -> None:
        while self._in.recv(1 << 20):
            pass


def trial(
    fn: Any, frames: Any, wire: _Wire, how: str, streams: int, tokens: int
) -> tuple[float, float]:
    """(tokens per second, CPU ms per token) of one round of ``streams`` calls."""
    from worker.pushed_calls import PushOut
    from worker.replica_child import _output_frame
    from worker.sdk import CallContext

    request = {"prompt": "Once upon a time", "max_tokens": tokens, "temperature": 0,
               "ignore_eos": True}  # fmt: skip
    made: list[int] = []

    def pulled(i: int) -> None:
        call = CallContext(f"c{i}", stream=True)
        for chunk in fn(request, call):
            wire.send(_output_frame(call.call_id, chunk))
        made.append(call.usage["completion_tokens"])

    def pushed(i: int) -> None:
        call = CallContext(f"c{i}", stream=True)
        out = PushOut(frames, partial(_output_frame, call.call_id), time.perf_counter(), {})
        fn.push_call(request, call, out)
        made.append(call.usage["completion_tokens"])

    run = pulled if how == PULLED else pushed
    threads = [threading.Thread(target=run, args=(i,)) for i in range(streams)]
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    total = sum(made)
    return total / wall, cpu * 1000 / total


def run(streams: int, tokens: int, trials: int, say: Any) -> dict[str, Any]:
    from worker.pushed_calls import StepFrames

    with tempfile.TemporaryDirectory(prefix="thaw-push-") as tmp:
        fn = _function(Path(tmp), streams)
        wire = _Wire()
        frames = StepFrames(wire.send)
        fn.add_step_listener(frames.flush)
        try:
            trial(fn, frames, wire, PULLED, streams, 8)  # warm both ways
            trial(fn, frames, wire, PUSHED, streams, 8)
            got: dict[str, list[tuple[float, float]]] = {PULLED: [], PUSHED: []}
            for n in range(trials):
                for how in (PULLED, PUSHED) if n % 2 == 0 else (PUSHED, PULLED):
                    got[how].append(trial(fn, frames, wire, how, streams, tokens))
                    say(f"trial {n + 1}/{trials} {how}: {got[how][-1][0]:.0f} tokens/s, "
                        f"{got[how][-1][1]:.3f} CPU ms a token")  # fmt: skip
        finally:
            fn.close()
    medians = {
        how: {
            "tokens_per_s": statistics.median(r[0] for r in rows),
            "cpu_ms_per_token": statistics.median(r[1] for r in rows),
        }
        for how, rows in got.items()
    }
    return {"streams": streams, "tokens": tokens, "trials": trials, "medians": medians}


def table(doc: dict[str, Any]) -> TableSpec:
    m = doc["medians"]
    base = m[PULLED]
    columns = [Column("replica side"), Column("tokens/s"), Column("CPU ms a token"),
               Column("x pulled tokens/s"), Column("x pulled CPU")]  # fmt: skip
    body = [
        [
            how,
            f"{m[how]['tokens_per_s']:.0f}",
            f"{m[how]['cpu_ms_per_token']:.3f}",
            f"{m[how]['tokens_per_s'] / base['tokens_per_s']:.2f}",
            f"{m[how]['cpu_ms_per_token'] / base['cpu_ms_per_token']:.2f}",
        ]
        for how in (PULLED, PUSHED)
    ]
    title = (f"an LLM replica's streams, {doc['streams']} at once, {doc['tokens']} tokens "
             f"each (medians of {doc['trials']})")  # fmt: skip
    return TableSpec(title, columns, body)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--streams", type=int, default=32)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--json", help="write the result as JSON to PATH (- for stdout)")
    args = p.parse_args(argv)
    console = Console()
    doc = run(args.streams, args.tokens, args.trials, console.log)
    render_table(table(doc), console)
    if args.json:
        write_json(doc, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
