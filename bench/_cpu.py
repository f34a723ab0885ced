"""CPU time spent by process trees, read from ``/proc`` (Linux).

Throughput and latency on a shared machine move with whatever else runs on
it (another tenant's load shows as steal time); the CPU seconds a process
spends per call move less, and say which part of thaw the time goes to. A
bench names the processes of each part (a server and the processes it
started, say) and reads their CPU before and after its timed run.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

PROC = Path("/proc")


def available() -> bool:
    return (PROC / "self" / "stat").exists()


def _stat(pid: int) -> list[str] | None:
    """The fields after the command name (which may hold spaces); None: gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return text.rpartition(") ")[2].split()


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, their children, ...), now."""
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def cpu_s(pids: list[int]) -> float:
    """User plus system seconds the processes spent so far (those gone count 0)."""
    ticks = 0
    for pid in pids:
        if (fields := _stat(pid)) is not None:
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


class TreeMeter:
    """CPU seconds of named groups of processes (fixed when made) since it was made."""

    def __init__(self, groups: dict[str, list[int]]) -> None:
        self.groups = groups
        self._start = {name: cpu_s(pids) for name, pids in groups.items()}

    def spent_s(self) -> dict[str, float]:
        return {name: cpu_s(pids) - self._start[name] for name, pids in self.groups.items()}


# The parts of a bench's private installation whose CPU a bench reports.
STACK_PARTS = ("server", "worker", "replica", "clients")


def stack_groups(stack: Any) -> dict[str, list[int]] | None:
    """The processes of a ``tests.e2e.stack.Stack``'s parts (``STACK_PARTS``): the
    server and what it started, the worker agent, the worker's replicas (and pool),
    and this process, the clients; None without ``/proc``."""
    if not available():
        return None
    server, worker = (p.popen.pid for p in stack.procs[:2])
    return {
        "server": [server, *descendants(server)],
        "worker": [worker],
        "replica": descendants(worker),
        "clients": [os.getpid()],
    }
