"""The zygote: one process with the replica's libraries imported, forked per generic process.

A generic replica process started from scratch pays Python's start and the
imports of torch, transformers and peft (seconds). The zygote pays them
once; every generic process after that is a ``fork`` of it (milliseconds):
the pool refills without competing for the CPU, and a pool miss costs a
fork instead of a fresh interpreter.

    agent (Zygote)                         zygote (python -m worker.zygote)
      spawn(device) ── request + socket fd ──▶ fork ─▶ child: device init, hello,
                    ◀── spawned {pid} ──────          serve (worker.replica_child)
                    ◀── exited {pid, code} ──  reaps its children (SIGCHLD)

The control socket is a Unix ``SOCK_SEQPACKET`` pair (one message per
packet); the child's own socket to the agent travels as ``SCM_RIGHTS``.
The zygote initialises no device and starts no thread, so a fork of it is
safe: CUDA and thread pools are created in the child. It asks torch about CUDA
through NVML only (``PYTORCH_NVML_BASED_CUDA_CHECK``), and after its imports it
checks that none of them initialised the CUDA driver (a child of a process that
did cannot use CUDA): only then does it say it ``forks_cuda``, and the pool
spawns CUDA processes afresh otherwise. The child is the
zygote's, not the agent's: its exit code reaches the agent as ``exited``,
and ``ForkedProcess`` gives the agent what it needs of a ``Popen``.
The zygote exits when the agent's end closes; its children keep serving
until their own sockets close.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import logging
import os
import queue
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from typing import IO, Any

MAX_PACKET = 64 << 10
START_TIMEOUT_S = 120.0
SPAWN_TIMEOUT_S = 10.0
_CUDA_ERROR_NOT_INITIALIZED = 3
_log = logging.getLogger(__name__)


class ZygoteError(Exception):
    """The zygote did not start, or could not fork."""


# --- the agent's side -----------------------------------------------------------


class ForkedProcess:
    """A child of the zygote, seen from the agent: what ``ProcessReplica`` and the pool
    need of a ``Popen`` (``pid``, ``returncode``, ``poll``, ``wait``, ``kill``).

    The exit code comes from the zygote, which reaps the child. Should the zygote
    die first, the child is watched through its pidfd and ends with code -9 (unknown).
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._done = threading.Event()
        self._lock = threading.Lock()
        # A pidfd names this process and no later one that reuses its pid.
        self._pidfd: int | None = None
        with contextlib.suppress(OSError):
            self._pidfd = os.pidfd_open(pid)

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(f"replica process {self.pid}", timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        with self._lock:
            if self.returncode is not None:
                return
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if self._pidfd is not None:
                    signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
                else:
                    os.kill(self.pid, signal.SIGKILL)

    def exited(self, code: int) -> None:
        with self._lock:
            if self.returncode is not None:
                return
            self.returncode = code
            if self._pidfd is not None:
                os.close(self._pidfd)
                self._pidfd = None
        self._done.set()

    def orphaned(self) -> None:
        """The zygote is gone: learn of this process's end from its pidfd."""
        fd = self._pidfd
        if fd is None:
            self.exited(-signal.SIGKILL)
            return

        def watch() -> None:
            with contextlib.suppress(OSError, ValueError):
                select.select([fd], [], [])
            self.exited(-signal.SIGKILL)

        threading.Thread(target=watch, name=f"orphan-{self.pid}", daemon=True).start()


class Zygote:
    """The agent's handle on one zygote process: ``spawn`` forks a generic process."""

    def __init__(
        self,
        preload: tuple[str, ...] = (),
        *,
        log: IO[bytes] | None = None,
        python: str = sys.executable,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        cmd = [python, "-m", "worker.zygote", "--fd", str(theirs.fileno())]
        if preload:
            cmd += ["--preload", ",".join(preload)]
        try:
            self.proc = subprocess.Popen(
                cmd,
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT if log is not None else None,
                start_new_session=True,
            )
        finally:
            theirs.close()
        self.sock = ours
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._pending: dict[int, queue.Queue[dict[str, Any]]] = {}
        self._children: dict[int, ForkedProcess] = {}
        self._early_exits: dict[int, int] = {}
        self._alive = True
        try:
            ready = self._first_message(start_timeout_s)
        except BaseException:
            self.close()
            raise
        self.imports_ms = float(ready.get("imports_ms", 0.0))
        self.forks_cuda = bool(ready.get("forks_cuda", False))
        self._reader = threading.Thread(target=self._read_loop, name="zygote", daemon=True)
        self._reader.start()

    @property
    def alive(self) -> bool:
        with self._lock:
            return self._alive

    def spawn(self, child_sock: socket.socket, device: str) -> ForkedProcess:
        """Fork a generic process that serves ``child_sock`` (the agent keeps the other end)."""
        request_id = next(self._ids)
        waiter: queue.Queue[dict[str, Any]] = queue.Queue()
        with self._lock:
            if not self._alive:
                raise ZygoteError("the zygote has exited")
            self._pending[request_id] = waiter
        request = {"id": request_id, "device": device, "requested_at": time.time()}
        try:
            with self._send_lock:
                socket.send_fds(self.sock, [json.dumps(request).encode()], [child_sock.fileno()])
            reply = waiter.get(timeout=SPAWN_TIMEOUT_S)
        except (OSError, queue.Empty) as exc:
            raise ZygoteError(f"the zygote did not fork a replica process ({exc!r})") from None
        finally:
            with self._lock:
                self._pending.pop(request_id, None)
        if reply.get("type") != "spawned":
            raise ZygoteError(f"the zygote could not fork: {reply.get('error', reply)}")
        pid = int(reply["pid"])
        child = ForkedProcess(pid)
        with self._lock:
            code = self._early_exits.pop(pid, None)
            if code is None and self._alive:
                self._children[pid] = child
        if code is not None:
            child.exited(code)
        elif not self.alive:
            child.orphaned()
        return child

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.sock.close()

    def _first_message(self, timeout_s: float) -> dict[str, Any]:
        self.sock.settimeout(timeout_s)
        try:
            data = self.sock.recv(MAX_PACKET)
        except (TimeoutError, OSError) as exc:
            raise ZygoteError(f"the zygote did not start ({exc}); see its output above") from None
        finally:
            self.sock.settimeout(None)
        msg = json.loads(data) if data else {"type": "failed", "error": "it exited"}
        if msg.get("type") != "ready":
            raise ZygoteError(f"the zygote did not start: {msg.get('error', msg)}")
        return dict(msg)

    def _read_loop(self) -> None:
        while True:
            try:
                data = self.sock.recv(MAX_PACKET)
            except OSError:
                data = b""
            if not data:
                break
            msg = json.loads(data)
            if msg.get("type") == "exited":
                self._on_exit(int(msg["pid"]), int(msg["code"]))
                continue
            with self._lock:
                waiter = self._pending.get(int(msg.get("id", 0)))
            if waiter is not None:
                waiter.put(msg)
        with self._lock:
            self._alive = False
            orphans = list(self._children.values())
            self._children.clear()
            waiters = list(self._pending.values())
        for waiter in waiters:
            waiter.put({"type": "failed", "error": "the zygote exited"})
        for child in orphans:
            child.orphaned()
        if orphans or waiters:
            _log.warning("the zygote exited; %d replica processes outlive it", len(orphans))

    def _on_exit(self, pid: int, code: int) -> None:
        with self._lock:
            child = self._children.pop(pid, None)
            if child is None:
                self._early_exits[pid] = code  # reaped before spawn() registered it
        if child is not None:
            child.exited(code)


# --- the zygote process ---------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="worker.zygote")
    parser.add_argument("--fd", type=int, required=True, help="inherited SOCK_SEQPACKET fd")
    parser.add_argument("--preload", default="", help="modules to import, comma-separated")
    args = parser.parse_args(argv)
    sock = socket.socket(fileno=args.fd)
    from control_plane import gil, heap
    from worker.replica_child import import_libraries

    gil.tune()  # its forks inherit it
    # torch.cuda.is_available() in an import would initialise the driver otherwise.
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"

    t0 = time.perf_counter()
    try:
        import_libraries(tuple(m for m in args.preload.split(",") if m))
    except Exception as exc:
        sock.send(json.dumps({"type": "failed", "error": repr(exc)}).encode())
        return 1
    imports_ms = (time.perf_counter() - t0) * 1000
    heap.freeze()  # the forks share these pages and never collect them
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes select through the pipe
    ready = {"type": "ready", "imports_ms": imports_ms, "forks_cuda": not cuda_initialized()}
    sock.send(json.dumps(ready).encode())
    while True:
        readable, _, _ = select.select([sock.fileno(), wake_r], [], [])
        if wake_r in readable:
            os.read(wake_r, 4096)
            _reap(sock)
        if sock.fileno() in readable:
            try:
                data, fds, _, _ = socket.recv_fds(sock, MAX_PACKET, 1)
            except OSError:
                data, fds = b"", []
            if not data:
                return 0  # the agent is gone; children end when their sockets close
            _fork_child(sock, json.loads(data), fds, (wake_r, wake_w))


def cuda_initialized() -> bool:
    """Whether this process initialised the CUDA driver (``cuInit``), which a fork's
    child could not then use. Asked of the driver itself: any of its calls but
    ``cuInit`` answers CUDA_ERROR_NOT_INITIALIZED (3) before it. No driver: False."""
    import ctypes

    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    count = ctypes.c_int()
    return int(driver.cuDeviceGetCount(ctypes.byref(count))) != _CUDA_ERROR_NOT_INITIALIZED


def _fork_child(
    sock: socket.socket, request: dict[str, Any], fds: list[int], wake: tuple[int, int]
) -> None:
    if len(fds) != 1:
        for fd in fds:
            os.close(fd)
        _send(sock, {"type": "failed", "id": request.get("id"), "error": "no socket passed"})
        return
    [child_fd] = fds
    pid = os.fork()
    if pid == 0:
        _run_child(sock, child_fd, request, wake)  # never returns
    os.close(child_fd)
    _send(sock, {"type": "spawned", "id": request["id"], "pid": pid})


def _run_child(
    sock: socket.socket, child_fd: int, request: dict[str, Any], wake: tuple[int, int]
) -> None:
    code = 1
    try:
        forked_at = time.time()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in wake:
            os.close(fd)
        sock.close()
        os.setsid()  # like a spawned one: a terminal's Ctrl-C reaches the agent only
        _reseed()
        from worker.replica_child import init_device, report_start_failure, serve_generic

        child_sock = socket.socket(fileno=child_fd)
        phases = {
            "process_start": max(0.0, (forked_at - float(request["requested_at"])) * 1000),
            "imports": 0.0,  # done once, in the zygote
        }
        try:
            phases["device_init"] = init_device(str(request["device"]))
        except Exception as exc:  # e.g. CUDA asked for on a machine without it
            report_start_failure(child_sock, exc)
        else:
            code = serve_generic(child_sock, str(request["device"]), phases)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _reseed() -> None:
    """A fork shares its parent's random state: give each child its own."""
    import random

    import torch

    random.seed()
    torch.seed()


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(sock, {"type": "exited", "pid": pid, "code": os.waitstatus_to_exitcode(status)})


def _send(sock: socket.socket, msg: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):  # the agent is gone: the loop ends on its next read
        sock.send(json.dumps(msg).encode())


if __name__ == "__main__":
    sys.exit(main())
