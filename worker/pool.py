"""Generic replica processes, and the pool that hands them out.

A generic process has Python, torch, the ``preload`` modules (the functions'
heavy libraries: transformers, peft) and its device context ready and has
said ``hello``; it is not yet any function's replica. The process runtime
takes one with ``ProcessPool.acquire`` and specializes it.

``warm_size`` generic processes per device are kept started in the
background; a pooled one is also told to ``prepare`` its weight loader for
the worker's store (store client, disk cache, RAM tier, staging buffers).
The runtime asks for a refill (``refill_later``) once the process it took
is specialized, so the refill does not compete with that cold start for
the CPU. With ``warm_size=0`` ``acquire`` spawns one on demand, so the
cold start pays process start, imports and device init. A pooled process's
generic phases were paid before the request, so the runtime reports them as
zero for that cold start.

With ``zygote`` (the worker's default) a generic CPU process is a fork of
the worker's zygote (``worker.zygote``), which imported the libraries once:
a refill or a pool miss costs a fork, not a fresh interpreter and its
imports. Should the zygote fail, processes are spawned afresh until a new
one starts. A CUDA process is a fork too, and makes its own CUDA context,
when the zygote's imports left the CUDA driver uninitialised (the zygote
checks, ``Zygote.forks_cuda``); it is spawned afresh otherwise.
"""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, Protocol

from worker.child_protocol import (
    FROM_CHILD,
    Hello,
    LoadStats,
    Prepare,
    Prepared,
    SetupFailed,
    StoreSpec,
    dump,
)
from worker.frames import FrameError, FrameSocket
from worker.zygote import Zygote, ZygoteError

HELLO_TIMEOUT_S = 120.0
_log = logging.getLogger(__name__)


class SpawnError(Exception):
    """A generic replica process did not come up."""


class ProcessLike(Protocol):
    """What the runtime needs of a ``Popen``: a spawned process, a forked one
    (``worker.zygote.ForkedProcess``), a container (``ContainerWait``)."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def kill(self) -> None: ...


@dataclass
class GenericProcess:
    proc: ProcessLike
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
    preload: tuple[str, ...] = (),
) -> GenericProcess:
    """Start ``worker.replica_child`` and wait for its hello.

    The child gets one end of a Unix socket pair as an inherited fd; it
    exits when the other end closes, so it cannot outlive this process.
    """
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    cmd = [python, "-m", "worker.replica_child", "--fd", str(theirs.fileno())]
    cmd += ["--device", device, "--spawned-at", repr(time.time())]
    if preload:
        cmd += ["--preload", ",".join(preload)]
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
    return _greeted(proc, ours, device, hello_timeout_s)


def fork_generic(
    zygote: Zygote, device: str, *, hello_timeout_s: float = HELLO_TIMEOUT_S
) -> GenericProcess:
    """Fork a generic process from ``zygote`` and wait for its hello."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        proc = zygote.spawn(theirs, device)
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    return _greeted(proc, ours, device, hello_timeout_s)


def _greeted(
    proc: ProcessLike, ours: socket.socket, device: str, hello_timeout_s: float
) -> GenericProcess:
    conn = FrameSocket(ours)
    try:
        hello = _await_hello(conn, hello_timeout_s)
    except BaseException:
        proc.kill()
        proc.wait()
        conn.close()
        raise
    return GenericProcess(proc, conn, device, dict(hello.phases_ms))


def prepare_loader(
    process: GenericProcess,
    store: StoreSpec,
    host_bytes: int = 0,
    imports: list[str] | None = None,
    timeout_s: float = HELLO_TIMEOUT_S,
) -> None:
    """Have a generic process build its weight loader, populate ``host_bytes`` of
    memory for its weights and import ``imports`` now; raise ``SpawnError`` if it cannot."""
    process.conn.send(dump(Prepare(store=store, host_bytes=host_bytes, imports=imports or [])))
    process.conn.sock.settimeout(timeout_s)
    try:
        msg = FROM_CHILD.validate_python(process.conn.recv())
    except (TimeoutError, FrameError, OSError) as exc:
        raise SpawnError(f"the replica process did not prepare its loader ({exc})") from None
    finally:
        process.conn.sock.settimeout(None)
    if isinstance(msg, SetupFailed):
        raise SpawnError(f"the replica process could not prepare its loader: {msg.error}")
    if not isinstance(msg, Prepared):
        raise SpawnError(f"the replica process sent {msg.type!r} instead of prepared")


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
    """Generic processes per device, ``warm_size`` of them kept ready.

    ``store``: what pooled processes prepare their loader for (None: they
    do not). ``preload``: modules every generic process imports at start.
    ``zygote``: fork generic processes from a zygote instead of spawning them.
    ``host_bytes_max``: the most host memory a pooled CPU process populates for
    its start's weights; it populates what the last CPU start loaded (0: off).
    ``refill_delay_s``: how long after a start the pool refills, so the refill
    does not compete with the replica's first call for the CPUs.
    """

    def __init__(
        self,
        warm_size: int = 0,
        *,
        log: IO[bytes] | None = None,
        store: StoreSpec | None = None,
        preload: tuple[str, ...] = (),
        zygote: bool = False,
        host_bytes_max: int = 0,
        refill_delay_s: float = 0.0,
    ) -> None:
        self.warm_size = warm_size
        self.log = log
        self.store = store
        self.preload = preload
        self.use_zygote = zygote
        self.host_bytes_max = host_bytes_max
        self.refill_delay_s = refill_delay_s
        self._host_bytes = 0  # what the last CPU start loaded outside the RAM tier
        self._imports: dict[str, list[str]] = {}  # per device: what its last start imported
        self._zygote: Zygote | None = None
        self._zygote_failed = False  # it could not start: spawn afresh from now on
        self._zygote_lock = threading.Lock()
        self._warm: dict[str, list[GenericProcess]] = {}
        self._handed_out: list[GenericProcess] = []
        self._starting: dict[str, int] = {}  # per device: started to fill the pool, not in yet
        self._lock = threading.Lock()
        self._filled = threading.Condition(self._lock)  # a start to fill the pool ended
        self._closed = False

    def acquire(self, device: str) -> tuple[GenericProcess, bool]:
        """A generic process for ``device``, and whether it came warm from the pool."""
        with self._lock:
            warm = self._warm.get(device, [])
            while warm:
                proc = warm.pop()
                if proc.proc.poll() is None:
                    self._handed_out.append(proc)
                    return proc, True
                proc.kill()  # it died while waiting: reap it
        proc = self._spawn(device)
        with self._lock:
            self._handed_out.append(proc)
        return proc, False

    def size(self) -> int:
        """Warm processes waiting to be acquired."""
        with self._lock:
            return sum(len(v) for v in self._warm.values())

    def busy(self) -> int:
        """Processes handed out and still alive: being specialized, or serving as replicas."""
        with self._lock:
            self._handed_out = [p for p in self._handed_out if p.proc.poll() is None]
            return len(self._handed_out)

    def starting(self) -> int:
        """Processes being started to fill the pool."""
        with self._lock:
            return sum(self._starting.values())

    def prewarm(self, device: str) -> None:
        """Fill the pool for ``device`` up to ``warm_size``; return when it is full.

        Blocking: where another thread is already starting a process for ``device``,
        this waits for that start rather than returning before the process is in.
        Each device counts its own starts: a CPU process being started does not stand
        in for a CUDA one (a GPU worker pre-warms both at once)."""
        while True:
            with self._lock:
                while True:
                    if self._closed:
                        return
                    warm = len(self._warm.get(device, []))
                    starting = self._starting.get(device, 0)
                    if warm >= self.warm_size:
                        return
                    if warm + starting < self.warm_size:
                        break
                    self._filled.wait()  # another thread's start for this device
                self._starting[device] = starting + 1
            proc: GenericProcess | None = None
            try:
                proc = self._spawn_prepared(device)
            finally:
                with self._lock:
                    self._starting[device] -= 1
                    kept = proc is not None and not self._closed
                    if proc is not None and kept:
                        self._warm.setdefault(device, []).append(proc)
                    self._filled.notify_all()
            if proc is not None and not kept:  # the pool closed while it started
                proc.kill()
                return

    def _spawn(self, device: str) -> GenericProcess:
        t0 = time.perf_counter()
        zygote = self._zygote_running() if self.use_zygote else None
        # A CUDA context does not survive a fork: a CUDA process is a fork only of a
        # zygote that never initialised the driver, and makes its own context.
        if zygote is not None and (device == "cpu" or zygote.forks_cuda):
            waited_ms = (time.perf_counter() - t0) * 1000
            try:
                proc = fork_generic(zygote, device)
            except ZygoteError as exc:
                _log.warning("spawning a replica process afresh: %s", exc)
            else:
                # A start that came while the zygote was still importing the preload
                # waited for those imports: they are this start's too.
                proc.phases_ms["imports"] = proc.phases_ms.get("imports", 0.0) + waited_ms
                return proc
        return spawn_generic(device, log=self.log, preload=self.preload)

    def start_zygote(self) -> None:
        """Start the zygote now (blocking), so the first spawn is a fork already."""
        if self.use_zygote:
            self._zygote_running()

    def _zygote_running(self) -> Zygote | None:
        """The zygote, started (again) if it is not running; None if it cannot start."""
        with self._zygote_lock:
            if self._closed or self._zygote_failed:
                return None
            if self._zygote is not None and self._zygote.alive:
                return self._zygote
            if self._zygote is not None:
                self._zygote.close()
            try:
                self._zygote = Zygote(self.preload, log=self.log)
            except ZygoteError as exc:
                _log.warning("no zygote, replica processes are spawned afresh: %s", exc)
                self._zygote, self._zygote_failed = None, True
            return self._zygote

    def note_start(self, device: str, loads: Sequence[LoadStats], imports: list[str]) -> None:
        """A start on ``device`` loaded ``loads`` and imported ``imports``: the next
        pooled processes import those too, and CPU ones populate that much host
        memory for their own start's buffers."""
        self._imports[device] = list(imports)
        if device == "cpu":
            self._host_bytes = min(sum(load.arena_bytes for load in loads), self.host_bytes_max)

    def _spawn_prepared(self, device: str) -> GenericProcess:
        proc = self._spawn(device)
        if self.store is not None:
            host_bytes = self._host_bytes if device == "cpu" else 0
            imports = self._imports.get(device, [])
            try:
                prepare_loader(proc, self.store, host_bytes, imports)
            except BaseException:
                proc.kill()
                raise
        return proc

    def refill_later(self, device: str) -> None:
        """Fill the pool for ``device`` again, in the background, ``refill_delay_s`` from now."""
        timer = threading.Timer(self.refill_delay_s, self._refill, args=(device,))
        timer.daemon = True
        timer.start()

    def _refill(self, device: str) -> None:
        try:
            self.prewarm(device)
        except SpawnError as exc:  # the next acquire spawns on demand and reports why
            _log.warning("could not refill the replica pool for %s: %s", device, exc)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            procs = [p for v in self._warm.values() for p in v]
            self._warm.clear()
            self._filled.notify_all()
        for proc in procs:
            proc.kill()
        with self._zygote_lock:
            if self._zygote is not None:
                self._zygote.close()
                self._zygote = None
