"""Functions the fault tests deploy (bundle pushed from this directory).

``Chaos`` does what its input asks: sleep, crash its own process (segfault,
abort, run out of memory under a limit), stream slowly, or answer; on a worker
started with ``CHAOS_BROKEN_FILE`` it fails every call while that file exists. Every call
appends its id to ``RUNS_DIR/<call id>`` when that variable is set, so a test
counts real executions, not what the control plane believes.
"""

from __future__ import annotations

import ctypes
import os
import resource
import time
from pathlib import Path
from typing import Any


def _record_run(call: Any) -> None:
    runs = os.environ.get("RUNS_DIR")
    if runs and call is not None:
        with open(Path(runs, call.call_id), "a") as f:
            f.write(f"{os.getpid()}\n")


class Chaos:
    def setup(self, ctx: Any) -> None:
        self.replica_id = ctx.replica_id
        setup_sleep_s = float(os.environ.get("SETUP_SLEEP_S", "0"))
        time.sleep(setup_sleep_s)  # a cold start longer than a caller's deadline
        pid_dir = os.environ.get("PID_DIR")
        if pid_dir:
            Path(pid_dir, self.replica_id).write_text(str(os.getpid()))

    def __call__(self, input: Any, call: Any) -> Any:
        _record_run(call)
        broken = os.environ.get("CHAOS_BROKEN_FILE")  # set on a worker: its machine is "broken"
        if broken and Path(broken).exists():
            raise RuntimeError(f"this machine is broken: {Path(broken).read_text()}")
        if not isinstance(input, dict):
            return {"pid": os.getpid(), "replica": self.replica_id, "input": input}
        if input.get("sleep_s"):
            time.sleep(float(input["sleep_s"]))
        crash = input.get("crash")
        if crash == "segfault":
            ctypes.string_at(0)  # reads address 0: SIGSEGV
        elif crash == "abort":
            os.abort()
        elif crash == "oom":
            _exhaust_memory(int(input.get("limit_bytes", 512 << 20)))
        if input.get("stream"):
            return self._stream(int(input["stream"]), float(input.get("every_s", 0.2)))
        return {"pid": os.getpid(), "replica": self.replica_id, "input": input}

    def _stream(self, n: int, every_s: float) -> Any:
        for i in range(n):
            yield {"i": i, "pid": os.getpid()}
            time.sleep(every_s)


def _exhaust_memory(limit_bytes: int) -> None:
    """Cap this process's address space above what it uses, then allocate past it.

    Allocation fails with MemoryError inside Python; a process out of memory
    for real is killed by the kernel, so exit as the OOM killer would.
    """
    used = _vm_size_bytes()
    resource.setrlimit(resource.RLIMIT_AS, (used + limit_bytes, used + limit_bytes))
    hoard = []
    try:
        while True:
            hoard.append(bytearray(64 << 20))
    except MemoryError:
        os.kill(os.getpid(), 9)


def _vm_size_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 0
