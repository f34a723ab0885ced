"""What a replica prints: secrets redacted, each call's output capped.

Installed in the replica child when it is specialized (``worker.specialize``):
``sys.stdout`` and ``sys.stderr`` become :class:`GuardedStream` objects that

* hold text until a whole line is there, then replace every secret value the
  replica was given by ``[redacted:NAME]`` (a secret split across ``write``
  calls within one line is still caught);
* count what each call wrote, by its thread — calls run one at a time on each
  of a pool of threads, and each restarts its thread's count (:func:`start_call`)
  — and past ``max_bytes_per_call`` drop the rest of that call's output, after
  one marker line saying so and naming the setting.

Only Python-level writes pass through here; a C extension writing to file
descriptor 1 or 2 directly bypasses it.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Mapping
from typing import Any, TextIO

from worker.call_guard import redact

MARKER = (
    "[thaw: this call printed more than {cap} bytes; the rest of its output is dropped "
    "(THAW_MAX_LOG_BYTES_PER_CALL)]\n"
)


class GuardedStream:
    def __init__(self, inner: TextIO, secrets: Mapping[str, str], max_bytes: int | None) -> None:
        self.inner = inner
        self.secrets = dict(secrets)
        self.max_bytes = max_bytes
        self._local = threading.local()
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        pending = getattr(self._local, "pending", "") + text
        *lines, rest = pending.split("\n")
        self._local.pending = rest
        for line in lines:
            self._emit(line + "\n")
        return len(text)

    def flush(self) -> None:
        self._emit_pending("")
        self.inner.flush()

    def start_call(self) -> None:
        """A call starts on this thread: a line the last call here left unfinished goes
        out under that call's count, then the count starts again."""
        self._emit_pending("\n")
        self._local.written = 0
        self._local.marked = False

    def _emit_pending(self, end: str) -> None:
        """This thread's unfinished line, if any, out now with ``end``."""
        rest = getattr(self._local, "pending", "")
        if rest:
            self._local.pending = ""
            self._emit(rest + end)

    def _emit(self, text: str) -> None:
        text = redact(text, self.secrets)
        written = getattr(self._local, "written", 0)
        size = len(text.encode())
        if self.max_bytes is not None and written + size > self.max_bytes:
            if not getattr(self._local, "marked", False):
                self._local.marked = True
                self._write(MARKER.format(cap=self.max_bytes))
            return
        self._local.written = written + size
        self._write(text)

    def _write(self, text: str) -> None:
        with self._lock:
            self.inner.write(text)

    def __getattr__(self, name: str) -> Any:  # fileno, encoding, isatty...
        return getattr(self.inner, name)


def start_call() -> None:
    """Start this thread's counts again for a new call (nothing when not installed, or
    when the function put streams of its own in place)."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, GuardedStream):
            stream.start_call()


def install(secrets: Mapping[str, str], max_bytes_per_call: int | None) -> None:
    """Guard this process's ``sys.stdout`` and ``sys.stderr`` (once; later calls no-op)."""
    if isinstance(sys.stdout, GuardedStream):
        return
    sys.stdout = GuardedStream(sys.stdout, secrets, max_bytes_per_call)
    sys.stderr = GuardedStream(sys.stderr, secrets, max_bytes_per_call)
