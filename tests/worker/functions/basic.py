"""Small functions the worker tests run in real replica processes."""

from __future__ import annotations

import os
import re
import threading
import time
from typing import Any


class Echo:
    def setup(self, ctx: Any) -> None:
        self.device = ctx.device
        self.setup_calls = getattr(self, "setup_calls", 0) + 1

    def __call__(self, input: Any, call: Any) -> Any:
        return {
            "input": input,
            "device": self.device,
            "adapter": call.adapter,
            "call_id": call.call_id,
            "stream": call.stream,
            "setup_calls": self.setup_calls,
            "env": os.environ.get("THAW_TEST_ENV"),
        }


class Stream:
    def __call__(self, input: Any) -> Any:
        gap_s = float(input.get("gap_s", 0))  # between chunks, so they go out apart
        for i in range(int(input["n"])):
            if i and gap_s:
                time.sleep(gap_s)
            yield {"i": i}
        odd = input.get("odd")  # a last chunk JSON cannot hold as it is, or at all
        if odd == "nan":
            yield {"x": float("nan"), "y": float("inf")}
        elif odd == "set":
            yield {"s": {1, 2}}


class Flaky:
    """Raises when asked to, answers otherwise."""

    def __call__(self, input: Any) -> Any:
        if input.get("raise"):
            raise ValueError(f"asked to fail: {input['raise']}")
        if input.get("sleep_s"):
            time.sleep(float(input["sleep_s"]))
        if input.get("spin_s"):  # busy in Python: a cancel stops it at once
            end = time.monotonic() + float(input["spin_s"])
            while time.monotonic() < end:
                pass
        if input.get("hold_gil"):  # stuck in C with the GIL held: the process stops answering
            re.match(r"(a+)+$", "a" * 64 + "b")
        if input.get("exit"):
            os._exit(3)
        if input.get("not_json"):
            return object()
        return "ok"


class Lost:
    """Answers until a call asks it to lose the replica (``sdk.ReplicaLost``), raised
    by that call, or (``"later": true``) by its next engine_stats read."""

    def __init__(self) -> None:
        self.lost = False

    def __call__(self, input: Any) -> Any:
        from worker.sdk import ReplicaLost

        if input.get("lose"):
            raise ReplicaLost("the device is gone")
        if input.get("later"):
            self.lost = True
        return "ok"

    def engine_stats(self) -> Any:
        from control_plane.protocol import EngineStats
        from worker.sdk import ReplicaLost

        if self.lost:
            raise ReplicaLost("the engine could not start again")
        return EngineStats()


class FailingSetup:
    def setup(self, ctx: Any) -> None:
        raise RuntimeError("setup exploded on purpose")

    def __call__(self, input: Any) -> Any:
        return input


class Timed:
    """Reports phases of its own through ``CallContext.timings_ms``: one well formed,
    the others a reserved name, a bad name and a bad value (dropped by the replica)."""

    def __call__(self, input: Any, call: Any) -> Any:
        call.timings_ms.update(
            {"tokenize": 1.5, "execution": 99999.0, "Bad-Name": 1.0, "detok": "fast"}
        )
        if input.get("raise"):
            raise ValueError("failed after tokenizing")
        return "ok"


class Tokens:
    """Counts tokens as an LLM would, on ``CallContext.usage``: its input's words as
    the prompt, one completion token per word; ``bad``: a malformed count (dropped
    by the replica); ``raise``: fails after counting."""

    def __call__(self, input: Any, call: Any) -> Any:
        words = str(input.get("prompt", "")).split()
        call.usage.update(prompt_tokens=len(words), completion_tokens=len(words))
        if input.get("bad"):
            call.usage["completion_tokens"] = input["bad"]
        if input.get("raise"):
            raise ValueError("failed after counting")
        return " ".join(reversed(words))


class Random:
    """Draws from Python's and torch's default generators: each process its own."""

    def __call__(self, input: Any) -> Any:
        import random

        import torch

        return {"pid": os.getpid(), "random": random.random(), "torch": torch.rand(1).item()}


class Overlap:
    """Sleeps ``sleep_s`` and answers how many calls were running at once, at most."""

    def setup(self, ctx: Any) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.most = 0

    def __call__(self, input: Any) -> Any:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        time.sleep(float(input["sleep_s"]))
        with self.lock:
            self.running -= 1
            return {"most_at_once": self.most}


class Heap:
    """Runs a full collection and answers how many objects it skipped (frozen) and
    how much private memory the process gained by it."""

    def __call__(self, input: Any) -> Any:
        import gc

        from control_plane.heap import private_dirty_kib

        before_kib = private_dirty_kib()
        gc.collect()
        return {"frozen": gc.get_freeze_count(), "gained_kib": private_dirty_kib() - before_kib}


class Threads:
    """Says how many threads torch computes with in this replica."""

    def __call__(self, input: Any, call: Any) -> Any:
        import torch

        return {"torch_threads": torch.get_num_threads()}
