"""Batching bench: the example model served one call at a time vs in dynamic batches.

    python bench/batching.py [--clients 1,4,16] [--duration-s 10] [--max-batch-size 8]
                             [--max-wait-ms 5] [--max-tokens 16] [--json -|PATH]

Builds the example Llama (``examples/build_model.py``), pushes it and the
``examples/textgen`` bundle to a temporary store, and starts two replica
processes of it on this machine's device (``--device``): one plain
(``__call__``, its calls serialized by the model lock) and one with
``[batching]`` (``batch``). For each client count, that many threads call
each replica back to back for the duration (greedy, ``--max-tokens`` each,
prompts of a few lengths). It reports calls/s, tokens/s, latency p50/p95
and the mean batch size formed. The replica is driven directly (no control
plane), so the figures are the replica's own; the clients share the machine.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console

from bench._common import Column, TableSpec, machine_description, percentile, render_table
from bench._common import write_json as write_json_doc

REPO = Path(__file__).resolve().parents[1]
PROMPTS = ("Hello", "The quick brown fox", "Once upon a time, in a land far away, there lived")


@dataclass
class Run:
    """What one (mode, clients) run measured."""

    mode: str
    clients: int
    duration_s: float
    latencies_ms: list[float] = field(default_factory=list)
    tokens: int = 0
    batch_sizes: list[int] = field(default_factory=list)
    errors: int = 0

    def row(self) -> dict[str, Any]:
        lat = self.latencies_ms or [0.0]
        return {
            "mode": self.mode,
            "clients": self.clients,
            "calls": len(self.latencies_ms),
            "errors": self.errors,
            "calls_per_s": len(self.latencies_ms) / self.duration_s,
            "tokens_per_s": self.tokens / self.duration_s,
            "p50_ms": percentile(lat, 50),
            "p95_ms": percentile(lat, 95),
            "mean_batch": sum(self.batch_sizes) / len(self.batch_sizes) if self.batch_sizes else 1,
        }


def drive(replica: Any, mode: str, clients: int, duration_s: float, max_tokens: int) -> Run:
    """``clients`` threads calling ``replica`` back to back for ``duration_s``."""
    from worker.runtimes.base import CallRequest

    run, lock = Run(mode, clients, duration_s), threading.Lock()
    end = time.monotonic() + duration_s

    def client(k: int) -> None:
        n = 0
        while time.monotonic() < end:
            prompt = PROMPTS[(k + n) % len(PROMPTS)]
            request = CallRequest(
                f"{mode}-{clients}-{k}-{n}", {"prompt": prompt, "max_tokens": max_tokens}
            )
            t0 = time.perf_counter()
            final = list(replica.call(request))[-1]
            ms = (time.perf_counter() - t0) * 1000
            n += 1
            with lock:
                if final.kind != "succeeded":
                    run.errors += 1
                    continue
                run.latencies_ms.append(ms)
                run.tokens += int(final.output["tokens"])
                if final.batch_size is not None and final.batch_index == 0:
                    run.batch_sizes.append(final.batch_size)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return run


def start_replicas(
    tmp: Path, device: str, max_batch_size: int, max_wait_ms: float
) -> tuple[Any, Any, Any]:
    """(runtime, plain replica, batched replica) of the example model."""
    from examples.build_model import build_all
    from snapshotter.config import StoreConfig
    from snapshotter.manifest import ArtifactKind
    from snapshotter.push import push_directory
    from snapshotter.registry import Registry
    from snapshotter.stores import open_store
    from worker.child_protocol import ReplicaSpec, StoreSpec
    from worker.runtimes.process import ProcessRuntime

    dirs = build_all(tmp / "built")
    registry = Registry(open_store(StoreConfig(url=str(tmp / "store"))))
    model = push_directory(dirs["model"], "textgen-llama:v1", registry)
    bundle = push_directory(
        REPO / "examples" / "textgen", "fn/textgen:v1", registry, kind=ArtifactKind.BUNDLE
    )
    store = StoreSpec(
        url=str(tmp / "store"),
        cache_dir=str(tmp / "cache"),
        cache_max_bytes=1 << 30,
        bundles_dir=str(tmp / "bundles"),
    )
    spec = ReplicaSpec(
        replica_id="plain",
        function="textgen",
        bundle_digest=bundle.digest,
        entry="app:TextGen",
        model_digest=model.digest,
        device="cuda" if device == "cuda" else "cpu",
        store=store,
    )
    batched = spec.model_copy(
        update={
            "replica_id": "batched",
            "max_batch_size": max_batch_size,
            "max_wait_ms": max_wait_ms,
        }
    )
    runtime = ProcessRuntime()
    return runtime, runtime.start(spec, lambda *_: None), runtime.start(batched, lambda *_: None)


def table(rows: list[dict[str, Any]], title: str) -> TableSpec:
    cols = ["mode", "clients", "calls/s", "tokens/s", "p50 ms", "p95 ms", "mean batch", "errors"]
    spec = TableSpec(title, [Column(c, "left" if c == "mode" else "right") for c in cols])
    for r in rows:
        spec.rows.append(
            [
                r["mode"],
                str(r["clients"]),
                f"{r['calls_per_s']:.1f}",
                f"{r['tokens_per_s']:.0f}",
                f"{r['p50_ms']:.0f}",
                f"{r['p95_ms']:.0f}",
                f"{r['mean_batch']:.1f}",
                str(r["errors"]),
            ]
        )
    return spec


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--clients", default="1,4,16")
    p.add_argument("--duration-s", type=float, default=10.0)
    p.add_argument("--max-batch-size", type=int, default=8)
    p.add_argument("--max-wait-ms", type=float, default=5.0)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--json", default=None, help="write the results as JSON to PATH or - (stdout)")
    args = p.parse_args(argv)
    clients = [int(c) for c in args.clients.split(",")]
    with tempfile.TemporaryDirectory(prefix="thaw-bench-batching-") as tmp:
        runtime, plain, batched = start_replicas(
            Path(tmp), args.device, args.max_batch_size, args.max_wait_ms
        )
        try:
            rows = []
            for n in clients:
                rows.append(
                    drive(plain, "one at a time", n, args.duration_s, args.max_tokens).row()
                )
                rows.append(
                    drive(
                        batched,
                        f"batched (max {args.max_batch_size})",
                        n,
                        args.duration_s,
                        args.max_tokens,
                    ).row()
                )
        finally:
            plain.stop()
            batched.stop()
            runtime.close()
    title = (
        f"example textgen, {args.device}, {args.max_tokens} tokens per call, "
        f"{args.duration_s:g} s per row"
    )
    render_table(table(rows, title), Console())
    if args.json:
        write_json_doc(
            {"machine": machine_description(), "args": vars(args), "rows": rows}, args.json
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
