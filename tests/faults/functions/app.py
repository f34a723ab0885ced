"""Functions the fault tests deploy (bundle pushed from this directory).

``Chaos`` does what its input asks: raise, sleep, spin in Python, crash its
own process (segfault, abort, run out of memory under a limit), stream slowly,
or answer; with ``ticks`` (a path) a sleep or spin appends a line there as it
goes and ``done`` once finished, so a test sees whether a call was stopped; with
``gate`` (a path) a call waits for that file to exist (60 s at most), so a test
holds calls running for as long as it needs, whatever the machine's speed. On a
worker started with ``CHAOS_BROKEN_FILE`` every call kills its replica process
while that file exists (a broken machine: the replica's fault, not the
function's). Every call appends its id to ``RUNS_DIR/<call id>`` when that
variable is set, so a test counts real executions, not what the control plane
believes.
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
        if os.environ.get("SETUP_FAIL"):  # a cold start that fails
            raise RuntimeError(f"setup failed: {os.environ['SETUP_FAIL']}")
        setup_sleep_s = float(os.environ.get("SETUP_SLEEP_S", "0"))
        time.sleep(setup_sleep_s)  # a cold start longer than a caller's deadline
        pid_dir = os.environ.get("PID_DIR")
        if pid_dir:
            Path(pid_dir, self.replica_id).write_text(str(os.getpid()))

    def __call__(self, input: Any, call: Any) -> Any:
        _record_run(call)
        broken = os.environ.get("CHAOS_BROKEN_FILE")  # set on a worker: its machine is "broken"
        if broken and Path(broken).exists():
            os._exit(70)  # this machine is broken: its replica dies under every call
        if not isinstance(input, dict):
            return {"pid": os.getpid(), "replica": self.replica_id, "input": input}
        if input.get("raise"):
            raise ValueError(f"bad input: {input['raise']}")
        if input.get("gate"):
            _await(Path(input["gate"]), 60.0)
        ticks = Path(input["ticks"]) if input.get("ticks") else None
        if input.get("sleep_s"):
            _tick(ticks, "sleeping")
            time.sleep(float(input["sleep_s"]))
        if input.get("spin_s"):
            _spin(float(input["spin_s"]), ticks)
        _tick(ticks, "done")
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


def _tick(ticks: Path | None, line: str) -> None:
    if ticks is not None:
        with open(ticks, "a") as f:
            f.write(line + "\n")


def _await(gate: Path, most_s: float) -> None:
    end = time.monotonic() + most_s
    while not gate.exists() and time.monotonic() < end:
        time.sleep(0.02)


def _spin(spin_s: float, ticks: Path | None) -> None:
    """Busy in Python bytecode (never in native code) for ``spin_s``, ticking every 50 ms."""
    end = time.monotonic() + spin_s
    next_tick = 0.0
    while (now := time.monotonic()) < end:
        if now >= next_tick:
            _tick(ticks, "spin")
            next_tick = now + 0.05


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
