"""A function the Docker runtime tests run inside a container over a lazy image mount."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any


class ImageInfo:
    def setup(self, ctx: Any) -> None:
        self.device = ctx.device

    def __call__(self, input: Any) -> Any:
        if input.get("sleep_s"):
            time.sleep(float(input["sleep_s"]))
        if input.get("read"):
            return {"bytes": Path(input["read"]).read_bytes().hex()}
        return {
            "debian_version": Path("/etc/debian_version").read_text().strip(),
            "pid": os.getpid(),
            "network": _can_open_a_socket(),
            "cgroup_memory": _memory_limit(),
            "root_writable": os.access("/usr", os.W_OK) and _try_write("/usr/thaw-probe"),
            "tmp_writable": _try_write("/tmp/thaw-probe"),
            "device": self.device,
        }


def _can_open_a_socket() -> bool:
    """True when the container has an interface other than loopback."""
    names = [name for _, name in socket.if_nameindex()]
    return any(n != "lo" for n in names)


def _memory_limit() -> int | None:
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        return None if text == "max" else int(text)
    return None


def _try_write(path: str) -> bool:
    try:
        Path(path).write_text("x")
    except OSError:
        return False
    return True
