"""Futures woken from another thread (``control_plane.loop_wakes``): at once outside a
pass, and inside one kept until it ends, then handed to each loop in one call."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from control_plane import loop_wakes


class Loop:
    """An event loop on a thread of its own, counting the calls handed to it (its own
    helpers' too: read ``handed`` between them)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.handed = 0
        call_soon_threadsafe = self.loop.call_soon_threadsafe

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.handed += 1
            return call_soon_threadsafe(*args, **kwargs)

        self.loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def future(self) -> asyncio.Future[None]:
        async def make() -> asyncio.Future[None]:
            return asyncio.get_running_loop().create_future()

        return asyncio.run_coroutine_threadsafe(make(), self.loop).result(5)

    def done(self, futures: list[asyncio.Future[None]], timeout_s: float = 5.0) -> bool:
        async def wait() -> bool:
            await asyncio.wait(futures, timeout=timeout_s)
            return all(f.done() and f.result() is None for f in futures)

        return asyncio.run_coroutine_threadsafe(wait(), self.loop).result(timeout_s + 5)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture
def loops() -> Iterator[tuple[Loop, Loop]]:
    a, b = Loop(), Loop()
    yield a, b
    a.close()
    b.close()


def test_outside_a_pass_each_future_is_handed_over_at_once(loops: tuple[Loop, Loop]) -> None:
    a, _ = loops
    futures = [a.future() for _ in range(3)]
    a.handed = 0
    for f in futures:
        loop_wakes.wake(a.loop, f)
    assert a.handed == 3 and a.done(futures)


def test_a_pass_hands_each_loop_its_futures_in_one_call_when_it_ends(
    loops: tuple[Loop, Loop],
) -> None:
    a, b = loops
    in_a, in_b = [a.future() for _ in range(5)], [b.future() for _ in range(2)]
    a.handed = b.handed = 0
    with loop_wakes.gathered():
        for f in in_a:
            loop_wakes.wake(a.loop, f)
        with loop_wakes.gathered():  # nested: the outer block hands them
            for f in in_b:
                loop_wakes.wake(b.loop, f)
        time.sleep(0.05)  # the loops run meanwhile; nothing was handed to them
        assert (a.handed, b.handed) == (0, 0)
        assert not any(f.done() for f in in_a + in_b)
    assert (a.handed, b.handed) == (1, 1)
    assert a.done(in_a) and b.done(in_b)


def test_a_future_done_already_or_a_closed_loop_is_passed_over(loops: tuple[Loop, Loop]) -> None:
    a, _ = loops
    cancelled, waiting = a.future(), a.future()
    a.loop.call_soon_threadsafe(cancelled.cancel)
    closed = asyncio.new_event_loop()
    closed.close()
    orphan = a.future()  # its reader's loop closed before the wake-up came
    with loop_wakes.gathered():
        loop_wakes.wake(closed, orphan)  # handed first: it fails, and the rest still go
        loop_wakes.wake(a.loop, cancelled)
        loop_wakes.wake(a.loop, waiting)
    loop_wakes.wake(closed, orphan)  # at once: no error either
    assert a.done([waiting])
    assert cancelled.cancelled() and not orphan.done()
