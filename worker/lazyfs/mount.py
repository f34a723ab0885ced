"""The worker's handle on one lazy image mount (a ``python -m worker.lazyfs`` process).

``LazyMount.start(config)`` spawns the mount process and returns once the
filesystem is mounted and its control socket answers, or raises
``MountError`` with the process's output. ``unmount`` is idempotent: it
asks the process to unmount (SIGTERM), waits, and falls back to a lazy
``fusermount3 -u -z`` and a kill, so a crashed mount never leaves a dead
mount point behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from worker.frames import FrameError, FrameSocket
from worker.lazyfs.config import MountConfig, MountStats

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0


class MountError(Exception):
    """A lazy mount could not be started or answered with an error."""


class LazyMount:
    def __init__(self, config: MountConfig, proc: subprocess.Popen[bytes], log_path: Path) -> None:
        self.config = config
        self.proc = proc
        self.log_path = log_path
        self.mounted = True

    @property
    def path(self) -> Path:
        return Path(self.config.mountpoint)

    @classmethod
    def start(cls, config: MountConfig, *, timeout_s: float = START_TIMEOUT_S) -> LazyMount:
        Path(config.mountpoint).mkdir(parents=True, exist_ok=True)
        log = tempfile.NamedTemporaryFile(prefix="thaw-lazyfs-", suffix=".log", delete=False)  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, "-m", "worker.lazyfs", "--config", config.model_dump_json()],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        mount = cls(config, proc, Path(log.name))
        try:
            mount._await_ready(timeout_s)
        except BaseException:
            mount.unmount()
            raise
        return mount

    def _await_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise MountError(
                    f"the lazy mount of {self.config.image_digest} exited with code "
                    f"{self.proc.returncode}: {self.output()[-2000:]}"
                )
            with contextlib.suppress(OSError, FrameError):
                if self.request({"op": "ping"}, timeout_s=1.0).get("ok"):
                    return
            time.sleep(0.02)
        raise MountError(
            f"the lazy mount at {self.config.mountpoint} did not answer in {timeout_s:g}s"
        )

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    # --- control -----------------------------------------------------------------
    def request(self, message: dict[str, Any], *, timeout_s: float = 60.0) -> dict[str, Any]:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout_s)
        frames = FrameSocket(sock)
        try:
            sock.connect(self.config.control_socket)
            frames.send(message)
            return frames.recv()
        finally:
            frames.close()

    def _ask(self, message: dict[str, Any], timeout_s: float = 60.0) -> dict[str, Any]:
        try:
            reply = self.request(message, timeout_s=timeout_s)
        except (OSError, FrameError) as exc:
            raise MountError(f"the lazy mount at {self.config.mountpoint} is gone: {exc}") from None
        if not reply.get("ok"):
            raise MountError(f"the lazy mount refused {message['op']}: {reply.get('error')}")
        return reply

    def stats(self) -> MountStats:
        return MountStats.model_validate(self._ask({"op": "stats"})["stats"])

    def save_profile(self) -> list[str]:
        """Stop recording; store the first-read order as the image's prefetch profile."""
        return [str(p) for p in self._ask({"op": "save_profile"})["order"]]

    def wait_prefetch(self, timeout_s: float = 60.0) -> bool:
        reply = self._ask({"op": "wait_prefetch", "timeout_s": timeout_s}, timeout_s + 5)
        return bool(reply["done"])

    # --- stop --------------------------------------------------------------------
    def unmount(self) -> None:
        if not self.mounted:
            return
        self.mounted = False
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        # A killed or crashed process leaves its mount point "transport not connected".
        if os.path.ismount(self.config.mountpoint) or _is_dead_mount(self.config.mountpoint):
            subprocess.run(["fusermount3", "-u", "-z", self.config.mountpoint], capture_output=True)
        self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> LazyMount:
        return self

    def __exit__(self, *exc: object) -> None:
        self.unmount()


def _is_dead_mount(path: str) -> bool:
    try:
        os.stat(path)
    except OSError as exc:
        return exc.errno == 107  # ENOTCONN
    return False
