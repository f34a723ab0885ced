"""Work spread over the CPUs this process may use, a thread a task, for work that runs
outside the GIL (hashing, page faults, DMA waits)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def run_each(tasks: Sequence[T], run: Callable[[T], None], thread_name: str) -> None:
    """``run(task)`` for every task, at once on up to the usable CPUs (in this thread
    when there is one task or one CPU); raises the first failure in order, once the
    others have finished."""
    workers = min(len(tasks), usable_cpus())
    if workers <= 1:
        for task in tasks:
            run(task)
        return
    with ThreadPoolExecutor(workers, thread_name_prefix=thread_name) as threads:
        list(threads.map(run, tasks))
