"""What a replica prints: secrets redacted, each call's output capped.

Installed in the replica child when it is specialized (``worker.specialize``):
``sys.stdout`` and ``sys.stderr`` become :class:`GuardedStream` objects that

* hold text until a whole line is there, then replace every secret value the
  replica was given by ``[redacted:NAME]`` (a secret split across ``write``
  calls within one line is still caught);
* count what each thread wrote — a call runs on a thread of its own — and past
  ``max_bytes_per_call`` drop the rest of that call's output, after one marker
  line saying so and naming the setting.

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
        rest = getattr(self._local, "pending", "")
        if rest:
            self._local.pending = ""
            self._emit(rest)
        self.inner.flush()

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


def install(secrets: Mapping[str, str], max_bytes_per_call: int | None) -> None:
    """Guard this process's ``sys.stdout`` and ``sys.stderr`` (once; later calls no-op)."""
    if isinstance(sys.stdout, GuardedStream):
        return
    sys.stdout = GuardedStream(sys.stdout, secrets, max_bytes_per_call)
    sys.stderr = GuardedStream(sys.stderr, secrets, max_bytes_per_call)
