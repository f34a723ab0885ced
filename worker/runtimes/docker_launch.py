"""A replica container's layout (the pure plan, the root skeleton) and its handles.

``ContainerWait`` gives ``ProcessReplica`` the ``Popen`` calls it makes;
``ContainerProcess`` is a generic replica in a container (its ``kill`` also
removes the container and unmounts the image); ``Launched`` is a plain
command over a lazy mount (benchmarks).

The engine cannot run a container on an arbitrary directory, so a container
"runs over" a lazy mount like this::

    /                      a skeleton image (``thaw-root:<hex16>``): the image's
                           top-level symbolic links, empty top-level directories
    /usr, /etc, /var, …    each top-level directory of the lazy mount, bind-mounted
                           read-only: every byte read comes through the FUSE mount
    /proc /sys /dev        the engine's own
    /tmp /run              tmpfs (the image is read-only)
    /run/thaw              the worker's socket directory (the replica dials in)
    <host paths>           the worker's Python, its venv and thaw's code, read-only at
                           the same paths: the replica child runs with the worker's
                           interpreter (same ABI; the image supplies the OS)
    <cache>, <store>       the worker's chunk cache and a local store, read-only, so
                           weights still stream through the snapshotter
    <bundles>              read-write: code and model files materialized by digest

A read-only mount cannot grow mount points, so the lazy mount adds empty
placeholders (``extra_dirs``/``extra_files``) where the image lacks them.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import subprocess
import tarfile
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from docker.errors import DockerException

from worker.frames import FrameSocket
from worker.lazyfs.mount import LazyMount
from worker.lazyfs.tree import Tree
from worker.pool import GenericProcess

CONTAINER_SOCKET_DIR = "/run/thaw"
ENGINE_DIRS = ("proc", "sys", "dev")
TMPFS_DIRS = ("tmp", "run")
ENGINE_FILES = ("etc/hosts", "etc/hostname", "etc/resolv.conf")
# Dial the worker's socket, then become the replica child on that connection.
ENTRY_CODE = (
    "import os,socket,sys\n"
    "s=socket.socket(socket.AF_UNIX,socket.SOCK_STREAM)\n"
    "s.connect(sys.argv[1])\n"
    "os.set_inheritable(s.fileno(),True)\n"
    "os.execv(sys.executable,[sys.executable,'-m','worker.replica_child','--fd',"
    "str(s.fileno())]+sys.argv[2:])\n"
)


@dataclass(frozen=True)
class Bind:
    source: str
    target: str
    read_only: bool = True


@dataclass(frozen=True)
class ContainerPlan:
    """Everything ``containers.run`` is given, decided without the engine."""

    command: list[str]
    binds: list[Bind]
    tmpfs: dict[str, str]
    env: dict[str, str]
    network_mode: str | None
    mem_limit: int | None
    nano_cpus: int | None
    gpus: bool
    labels: dict[str, str] = field(default_factory=dict)

    def volumes(self) -> dict[str, dict[str, str]]:
        return {
            b.source: {"bind": b.target, "mode": "ro" if b.read_only else "rw"} for b in self.binds
        }


def placeholders(host_paths: list[str], data_paths: list[str]) -> tuple[list[str], list[str]]:
    """(extra_dirs, extra_files) the lazy mount must provide as mount points."""
    return sorted(set(host_paths) | set(data_paths)), list(ENGINE_FILES)


def plan_container(
    *,
    tree: Tree,
    mountpoint: str,
    socket_dir: str,
    python: str,
    host_paths: list[str],
    data_ro: list[str],
    data_rw: list[str],
    child_args: list[str],
    env: dict[str, str],
    network: bool,
    memory_bytes: int | None,
    cpus: float | None,
    gpus: bool,
    labels: dict[str, str],
) -> ContainerPlan:
    """Pure: the container for one replica over the lazy mount at ``mountpoint``."""
    binds = [
        Bind(f"{mountpoint}/{name}", f"/{name}")
        for name, ino in sorted(tree.nodes[1].children.items())
        if name not in ENGINE_DIRS + TMPFS_DIRS and tree.nodes[ino].entry.type != "symlink"
    ]
    binds += [Bind(p, p) for p in host_paths]
    binds += [Bind(p, p) for p in data_ro]
    binds += [Bind(p, p, read_only=False) for p in data_rw]
    binds.append(Bind(socket_dir, CONTAINER_SOCKET_DIR, read_only=False))
    return ContainerPlan(
        command=[python, "-c", ENTRY_CODE, f"{CONTAINER_SOCKET_DIR}/replica.sock", *child_args],
        binds=binds,
        tmpfs={f"/{d}": "rw,exec" for d in TMPFS_DIRS},
        env={"PYTHONDONTWRITEBYTECODE": "1", **env},
        network_mode=None if network else "none",
        mem_limit=memory_bytes,
        nano_cpus=int(cpus * 1e9) if cpus else None,
        gpus=gpus,
        labels=labels,
    )


def skeleton_tar(tree: Tree) -> bytes:
    """The root skeleton: top-level links and empty directories of the image."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        names = {n: tree.nodes[i] for n, i in tree.nodes[1].children.items()}
        for d in (*ENGINE_DIRS, *TMPFS_DIRS):
            names.pop(d, None)
            tar.addfile(_info(d, tarfile.DIRTYPE, 0o755))
        for name, node in sorted(names.items()):
            if node.entry.type == "symlink":
                tar.addfile(_info(name, tarfile.SYMTYPE, 0o777, node.entry.link))
            elif node.is_dir:
                tar.addfile(_info(name, tarfile.DIRTYPE, node.entry.mode))
    return buf.getvalue()


def _info(name: str, kind: bytes, mode: int, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.linkname = kind, mode, link
    return info


class ContainerWait:
    """What ``ProcessReplica`` needs of a ``Popen``, for a container.

    ``wait`` returns the exit code (``-9`` once the container is gone) and
    raises ``subprocess.TimeoutExpired`` on timeout, as ``Popen.wait`` does.
    """

    def __init__(self, container: Any) -> None:
        self.container = container
        self.returncode: int | None = None
        self.pid = 0

    def poll(self) -> int | None:
        if self.returncode is None:
            from docker.errors import NotFound

            try:
                self.container.reload()
            except NotFound:
                self.returncode = -9
                return self.returncode
            if self.container.status in ("exited", "dead"):
                self.returncode = int(self.container.attrs["State"]["ExitCode"])
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        from docker.errors import APIError, NotFound
        from requests.exceptions import ConnectionError, ReadTimeout

        if self.returncode is not None:
            return self.returncode
        try:
            result = self.container.wait(timeout=timeout)
            self.returncode = int(result.get("StatusCode", -1))
        except (ReadTimeout, ConnectionError):
            name = f"container {self.container.id[:12]}"
            raise subprocess.TimeoutExpired(name, timeout or 0) from None
        except (NotFound, APIError):
            self.returncode = -9
        return self.returncode

    def kill(self) -> None:
        from docker.errors import APIError

        with contextlib.suppress(APIError):  # already stopped or removed
            self.container.kill()


class ContainerProcess(GenericProcess):
    """A generic replica in a container; ``kill`` also removes it and unmounts its image."""

    def __init__(
        self, container: Any, conn: FrameSocket, device: str, phases_ms: dict[str, float],
        mount: LazyMount, workdir: Path,
    ) -> None:  # fmt: skip
        self.waiter = ContainerWait(container)
        super().__init__(self.waiter, conn, device, phases_ms)
        self.container = container
        self.mount = mount
        self.workdir = workdir
        self._lock = threading.Lock()
        self._gone = False

    def kill(self) -> None:
        with self._lock:
            if self._gone:
                return
            self._gone = True
        self.waiter.kill()
        with contextlib.suppress(Exception):
            self.waiter.wait(timeout=10)
        with contextlib.suppress(DockerException):
            self.container.remove(force=True)
        self.conn.close()
        self.mount.unmount()
        remove_workdir(self.workdir)


@dataclass
class Launched:
    """A container over a lazy mount, started by ``DockerRuntime.launch``."""

    container: Any
    mount: LazyMount
    workdir: Path

    def close(self) -> None:
        with contextlib.suppress(DockerException):
            self.container.remove(force=True)
        self.mount.unmount()
        remove_workdir(self.workdir)


def sock_dir(workdir: Path) -> Path:
    """Unix socket paths are capped at 107 bytes: keep them short, whatever the state dir."""
    return Path(tempfile.gettempdir()) / f"thaw-{workdir.name}"


def remove_workdir(workdir: Path) -> None:
    shutil.rmtree(sock_dir(workdir), ignore_errors=True)
    shutil.rmtree(workdir, ignore_errors=True)
