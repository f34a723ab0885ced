"""Functions the end-to-end tests deploy (bundle pushed from this directory)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any


class Probe:
    """Says which process and replica answered; sleeps or raises when asked."""

    def setup(self, ctx: Any) -> None:
        self.replica_id = ctx.replica_id
        self.tensors = len(ctx.weights)
        self.hidden = ctx.config.get("hidden_size")
        self.adapters = sorted(ctx.adapters)
        pid_dir = os.environ.get("PID_DIR")
        if pid_dir:  # lets a test find this replica's process
            Path(pid_dir, self.replica_id).write_text(str(os.getpid()))

    def __call__(self, input: Any, call: Any) -> Any:
        if input.get("sleep_s"):
            time.sleep(float(input["sleep_s"]))
        if input.get("raise"):
            raise RuntimeError(f"boom: {input['raise']}")
        return {
            "pid": os.getpid(),
            "replica": self.replica_id,
            "input": input,
            "tensors": self.tensors,
            "hidden": self.hidden,
            "adapters": self.adapters,
            "adapter": call.adapter,
        }


class Count:
    def __call__(self, input: Any) -> Any:
        for i in range(int(input["n"])):
            yield {"i": i}


class Tokens:
    """Counts tokens as an LLM would, on ``call.usage``: its prompt's words, and one
    completion token per word; ``bad``: a malformed count; ``raise``: fails after."""

    def __call__(self, input: Any, call: Any) -> Any:
        words = str(input.get("prompt", "")).split()
        call.usage.update(prompt_tokens=len(words), completion_tokens=len(words))
        if input.get("bad"):
            call.usage["completion_tokens"] = input["bad"]
        if input.get("raise"):
            raise RuntimeError("failed after counting")
        return " ".join(reversed(words))
