"""Waking asyncio futures from another thread: one hand-off to each loop for a pass
that wakes many.

``loop.call_soon_threadsafe`` writes a byte to the loop's self-pipe, a system call
that lets go of the interpreter lock. A thread that wakes a future per stream in one
pass over many streams (the direct stream reader, ``dispatch.direct_streams``: a step
of every stream at once) would give the lock away once per stream, and wait for it
back each time while the loop's thread, woken already, holds it. Inside
``gathered()`` the thread's wake-ups are kept, and handed to each loop in one call
when the pass ends::

    with gathered():            # the reader's pass over what select() returned
        ... wake(loop, f1) ...  # kept
        ... wake(loop, f2) ...  # kept
                                # loop.call_soon_threadsafe(set_all, [f1, f2])

Outside ``gathered()``, ``wake`` hands its future over at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator

_local = threading.local()  # .kept: the wake-ups of this thread's pass, or None


def wake(loop: asyncio.AbstractEventLoop, future: asyncio.Future[None]) -> None:
    """Set ``future``'s result to None in ``loop``, unless it is done (or its loop
    closed: no one waits for it)."""
    kept: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] | None
    kept = getattr(_local, "kept", None)
    if kept is not None:
        kept.append((loop, future))
        return
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(set_all, [future])


@contextlib.contextmanager
def gathered() -> Iterator[None]:
    """Keep this thread's wake-ups until the block ends, then hand each loop its own
    in one call (in the order they came). Nested: the outermost block hands them."""
    if getattr(_local, "kept", None) is not None:
        yield
        return
    _local.kept = []
    try:
        yield
    finally:
        kept, _local.kept = _local.kept, None
        by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
        for loop, future in kept:
            by_loop.setdefault(loop, []).append(future)
        for loop, futures in by_loop.items():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(set_all, futures)


def set_all(futures: list[asyncio.Future[None]]) -> None:
    """In the futures' loop: each one not done yet is woken (its result None)."""
    for future in futures:
        if not future.done():
            future.set_result(None)
