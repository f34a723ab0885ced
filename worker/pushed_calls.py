"""Streamed calls whose chunks a function pushes from one thread for many calls at once
(an LLM engine's router, after each batch step), sent to the agent one step at a time.

::

    engine router thread    out.chunk(chunk) per call, its Output frame into the
                            step's frames; out.end() for a call that ended
                            then StepFrames.flush(): every frame in one write, then
                            the calls that ended are told so
    call thread             function.push_call(input, call, out): starts the call,
                            waits in out.wait() until its end was flushed; then the
                            replica sends its Result, after its last Output

A pulled stream (a generator) wakes its call's thread for every chunk; here no
thread is woken per chunk, and a step's chunks for every call cross to the agent in
one write. A call that is cancelled or errs stops waiting at once; a chunk pushed
for it after that reaches the agent after its end, which drops it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

_WAKE_S = 0.1  # a waiting call thread wakes this often, so a cancel raised in it lands


class StepFrames:
    """The frames of one step, sent together by ``flush``. Thread-safe."""

    def __init__(self, send: Callable[[bytes], None]) -> None:
        self._send = send
        self._lock = threading.Lock()
        self._frames: list[bytes] = []
        self._ended: list[PushOut] = []

    def add(self, frame: bytes) -> None:
        with self._lock:
            self._frames.append(frame)

    def end(self, out: PushOut) -> None:
        """``out``'s call has pushed its last chunk: tell it so after the next flush."""
        with self._lock:
            self._ended.append(out)

    def flush(self) -> None:
        """Send the frames added since the last flush in one write, then release the
        calls that ended (their Result must follow their last Output)."""
        with self._lock:
            frames, self._frames = self._frames, []
            ended, self._ended = self._ended, []
        try:
            if frames:
                self._send(b"".join(frames))
        except OSError as exc:  # the agent is gone; the replica ends with it
            log.warning("a step's outputs were not sent: %s", exc)
        finally:
            for out in ended:
                out.done.set()


class PushOut:
    """One pushed call's side of ``StepFrames``: what the function calls."""

    def __init__(
        self,
        frames: StepFrames,
        encode: Callable[[Any], bytes],
        t0: float,
        timings: dict[str, float],
    ) -> None:
        self._frames = frames
        self._encode = encode  # a chunk -> its Output frame
        self._t0 = t0
        self._timings = timings
        self.done = threading.Event()

    def chunk(self, chunk: Any) -> None:
        """Push one chunk of the call's output (any thread)."""
        frame = self._encode(chunk)
        if "first_output" not in self._timings:
            self._timings["first_output"] = (time.perf_counter() - self._t0) * 1000
        self._frames.add(frame)

    def end(self) -> None:
        """The call pushed its last chunk, or ended with an error (any thread, once)."""
        self._frames.end(self)

    def wait(self) -> None:
        """Block the call's thread until its end has been sent (or a cancel raised
        in this thread stops it)."""
        while not self.done.wait(_WAKE_S):
            pass
