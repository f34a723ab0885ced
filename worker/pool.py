"""Generic replica processes, and the pool that hands them out.

A generic process has Python, torch and its device context ready and has
said ``hello``; it is not yet any function's replica. The process runtime
takes one with ``ProcessPool.acquire`` and specializes it.

``warm_size`` generic processes per device are kept started in the
background; with ``warm_size=0`` (the default) ``acquire`` spawns one on
demand, so the cold start pays process start, imports and device init.
A pooled process's generic phases were paid before the request, so the
runtime reports them as zero for that cold start.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import IO

from worker.child_protocol import FROM_CHILD, Hello, SetupFailed
from worker.frames import FrameError, FrameSocket

HELLO_TIMEOUT_S = 120.0


class SpawnError(Exception):
    """A generic replica process did not come up."""


@dataclass
class GenericProcess:
    proc: subprocess.Popen[bytes]
    conn: FrameSocket
    device: str
    phases_ms: dict[str, float] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.conn.close()


def spawn_generic(
    device: str,
    *,
    python: str = sys.executable,
    log: IO[bytes] | None = None,
    hello_timeout_s: float = HELLO_TIMEOUT_S,
) -> GenericProcess:
    """Start ``worker.replica_child`` and wait for its hello.

    The child gets one end of a Unix socket pair as an inherited fd; it
    exits when the other end closes, so it cannot outlive this process.
    """
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    cmd = [python, "-m", "worker.replica_child", "--fd", str(theirs.fileno())]
    cmd += ["--device", device, "--spawned-at", repr(time.time())]
    try:
        proc = subprocess.Popen(
            cmd,
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT if log is not None else None,
            start_new_session=True,  # a terminal's Ctrl-C reaches the agent, which stops us
        )
    finally:
        theirs.close()
    conn = FrameSocket(ours)
    try:
        hello = _await_hello(conn, hello_timeout_s)
    except BaseException:
        proc.kill()
        proc.wait()
        conn.close()
        raise
    return GenericProcess(proc, conn, device, dict(hello.phases_ms))


def _await_hello(conn: FrameSocket, timeout_s: float) -> Hello:
    conn.sock.settimeout(timeout_s)
    try:
        msg = FROM_CHILD.validate_python(conn.recv())
    except (TimeoutError, FrameError, OSError) as exc:
        raise SpawnError(
            f"the replica process did not start ({exc}); see its output above"
        ) from None
    finally:
        conn.sock.settimeout(None)
    if isinstance(msg, SetupFailed):
        raise SpawnError(f"the replica process could not start: {msg.error}")
    if not isinstance(msg, Hello):
        raise SpawnError(f"the replica process sent {msg.type!r} before hello")
    return msg


class ProcessPool:
    """Generic processes per device, ``warm_size`` of them kept ready."""

    def __init__(self, warm_size: int = 0, *, log: IO[bytes] | None = None) -> None:
        self.warm_size = warm_size
        self.log = log
        self._warm: dict[str, list[GenericProcess]] = {}
        self._lock = threading.Lock()
        self._closed = False

    def acquire(self, device: str) -> tuple[GenericProcess, bool]:
        """A generic process for ``device``, and whether it came warm from the pool."""
        with self._lock:
            warm = self._warm.get(device, [])
            while warm:
                proc = warm.pop()
                if proc.proc.poll() is None:
                    self._refill_later(device)
                    return proc, True
        return spawn_generic(device, log=self.log), False

    def size(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._warm.values())

    def prewarm(self, device: str) -> None:
        """Fill the pool for ``device`` up to ``warm_size`` (blocking)."""
        while not self._closed:
            with self._lock:
                if len(self._warm.get(device, [])) >= self.warm_size:
                    return
            proc = spawn_generic(device, log=self.log)
            with self._lock:
                if self._closed:
                    proc.kill()
                    return
                self._warm.setdefault(device, []).append(proc)

    def _refill_later(self, device: str) -> None:
        threading.Thread(target=self.prewarm, args=(device,), daemon=True).start()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            procs = [p for v in self._warm.values() for p in v]
            self._warm.clear()
        for proc in procs:
            proc.kill()
