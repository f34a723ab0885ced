"""thaw's side of the LLM bench: a private installation serving the model as an LLM
function, and the LLM cold start from zero against a naive one.

The installation is a server and one worker (SQLite, the filesystem broker, a scratch
store and cache, a 1 GiB RAM tier, the server's default intervals: ``PRODUCTION_ENV``)
with three LLM functions on the model:

    bench-llm        one replica kept warm, taking every stream (its engine queues past
                     ``max_num_seqs``, as the in-process engine does): the stream levels
    bench-llm-narrow the same with its off switch: on a CPU wide steps off
                     (``wide_step_ms_per_token = 0``: every step on the replica's own
                     threads, ``worker.llm.threads``), on a GPU CUDA graphs off
                     (``cuda_graphs = false``: every step eager); its levels beside
                     bench-llm's
    bench-llm-cold   scaled to zero after 2 s idle: the cold starts

A thaw cold start is ``POST /openai/v1/completions`` (streamed, one token) on the
function at zero, with the worker's pool refilled and the weights in the RAM tier
from the trial before: HTTP to the first token, timed by the client, with the call
record's phases. The naive cold start is a fresh process that imports transformers,
runs ``from_pretrained``, starts the same engine and produces the first token
(``python -m bench._llm_stack SPEC``), timed from its spawn.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from bench._coldstart_scenarios import wait_ready_replica
from bench._coldstart_setup import BenchStack, running
from bench._common import PRODUCTION_ENV, emit_result, run_fresh_process
from bench._llm_baselines import load, make_engine

FUNCTION = "bench-llm"
COLD_FUNCTION = "bench-llm-cold"
NARROW_FUNCTION = "bench-llm-narrow"
MODEL_REF = "bench-llm:v1"
RAM_TIER_BYTES = 1 << 30
POOL_REFILL_S = 5.0


def _spec(
    name: str,
    bundle: str,
    sizes: dict[str, int],
    scaling: dict[str, Any],
    device: str,
    **llm: Any,
) -> dict[str, Any]:
    return {
        "name": name,
        "bundle": bundle,
        "model": MODEL_REF,
        "device": device,
        "timeout_s": 600,
        "llm": {
            "max_num_seqs": sizes["max_num_seqs"],
            "max_batch_tokens": sizes["max_batch_tokens"],
            "kv_cache_mb": sizes["kv_cache_mb"],
            "dtype": "float32",
            **llm,
        },
        "scaling": scaling,
    }


def off_switch(device: str) -> dict[str, Any]:
    """The ``[llm]`` setting ``bench-llm-narrow`` turns off on ``device``."""
    return {"cuda_graphs": False} if device == "cuda" else {"wide_step_ms_per_token": 0.0}


@contextmanager
def installation(
    model_dir: Path,
    root: Path,
    sizes: dict[str, int],
    max_streams: int,
    device: str = "cpu",
    narrow: bool = True,
    server_processes: int = 1,
) -> Iterator[BenchStack]:
    """The private installation with its functions deployed and ``bench-llm`` ready
    (``bench-llm-narrow`` too, unless ``narrow`` is false), its server run as
    ``server_processes`` control-plane processes behind its port."""
    from snapshotter.manifest import ArtifactKind
    from snapshotter.push import push_directory
    from snapshotter.registry import Registry
    from snapshotter.stores import LocalStore

    store = root / "store"
    registry = Registry(LocalStore(store))
    push_directory(model_dir, MODEL_REF, registry)
    code = root / "code"
    code.mkdir(parents=True, exist_ok=True)
    (code / "thaw.toml").write_text("")  # an LLM function's bundle holds only its spec
    bundle = push_directory(code, "bundles/bench-llm:v1", registry, kind=ArtifactKind.BUNDLE)
    tier = Path("/dev/shm") / f"thaw-bench-llm-{root.name}"
    worker_env = {
        **PRODUCTION_ENV,  # every process: the server's intervals as a user gets them
        "THAW_CACHE_DIR": str(root / "cache"),
        "THAW_RAM_TIER_DIR": str(tier),  # set, so no worker removes it: the bench does
        "THAW_RAM_TIER_MAX_BYTES": str(RAM_TIER_BYTES),
        "THAW_SERVER_PROCESSES": str(server_processes),
    }
    with ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, tier, ignore_errors=True)
        stack = cleanup.enter_context(running(root / "stack", str(store), worker_env))
        warm = {"min_replicas": 1, "max_replicas": 1, "target_concurrency": max_streams}
        warm["idle_timeout_s"] = 3600
        stack.deploy(_spec(FUNCTION, bundle.digest, sizes, warm, device))
        if narrow:
            off = off_switch(device)
            stack.deploy(_spec(NARROW_FUNCTION, bundle.digest, sizes, warm, device, **off))
        cold = {"min_replicas": 0, "max_replicas": 1, "idle_timeout_s": 2}
        stack.deploy(_spec(COLD_FUNCTION, bundle.digest, sizes, cold, device))
        wait_ready_replica(stack, FUNCTION)
        if narrow:
            wait_ready_replica(stack, NARROW_FUNCTION)
        yield stack


def thaw_cold_start(stack: BenchStack) -> dict[str, Any]:
    """One cold start of ``bench-llm-cold`` from zero: seconds to the first token, and
    the call's record (cold, phases)."""
    stack.wait_scaled_to_zero(COLD_FUNCTION)
    stack.wait_pool_ready(POOL_REFILL_S)
    body = {"model": COLD_FUNCTION, "prompt": "Hello", "max_tokens": 1, "stream": True}
    first = None
    with stack.client(timeout_s=600) as c:
        started = time.perf_counter()
        with c.stream("POST", "/openai/v1/completions", json=body) as r:
            if r.status_code != 200:
                raise RuntimeError(f"cold call: {r.status_code} {r.read()[:500]!r}")
            call_id = r.headers["x-thaw-call-id"]
            for line in r.iter_lines():
                if first is None and line.startswith("data: {"):
                    first = time.perf_counter() - started
    if first is None:
        raise RuntimeError("the cold call streamed no token")
    call = stack.call(call_id)
    phases = call.get("phases_ms") or {}
    return {
        "first_token_s": first,
        "cold": call["cold"],
        "pool_hit": phases.get("process_start", 0.0) == 0.0,
        "phases_ms": phases,
        "timings_ms": call.get("timings_ms") or {},
    }


def naive_cold_start(model_dir: Path, sizes: dict[str, int], device: str = "cpu") -> dict[str, Any]:
    """A fresh process to its first token: total seconds from spawn, and its phases."""
    spec: dict[str, Any] = {"model_dir": str(model_dir), "sizes": sizes, "device": device}
    spec["spawned_at"] = time.time()
    return run_fresh_process("bench._llm_stack", spec).result


def _naive(spec: dict[str, Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    import torch  # noqa: F401
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401 (timed here)

    from worker.llm.engine import Sampling

    t1 = time.perf_counter()
    model, tokenizer = load(Path(spec["model_dir"]), spec.get("device", "cpu"))
    t2 = time.perf_counter()
    engine = make_engine(model, spec["sizes"])
    t3 = time.perf_counter()
    ids = list(tokenizer("Hello")["input_ids"])
    for step in engine.generate(ids, Sampling(max_new_tokens=1, temperature=1.0, seed=0)):
        if step.token_ids:
            break
    t4 = time.perf_counter()
    total_s = time.time() - float(spec["spawned_at"])
    engine.close()
    phases = {"imports_s": t1 - t0, "load_s": t2 - t1, "engine_s": t3 - t2}
    phases["first_token_s"] = t4 - t3
    return {"total_s": total_s, "phases": phases}


if __name__ == "__main__":
    emit_result(_naive(json.loads(sys.argv[1])))
