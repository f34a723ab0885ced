"""The Docker runtime: one container per replica, over a lazily mounted image.

A start, phase by phase (phases as the process runtime's, plus ``image_fetch``)::

    image_fetch      resolve NAME:TAG, read the layer TOCs, mount the image lazily
                     (its recorded profile starts prefetching now), ensure the
                     root skeleton image; stage code, model files and weight chunks
                     in the worker's cache (the container may have no network)
    pool_acquire     a pre-warmed container of the same image and limits, if any
    process_start    container create → the replica child's first line
    imports, device_init, weights_*, adapters, user_setup   from the child

The container dials ``/run/thaw/replica.sock`` (a Unix socket the worker
listens on, in a bind-mounted directory) and then speaks the same frames
protocol as a process replica (``worker.child_protocol``), so ``DockerReplica``
is a ``ProcessReplica`` whose process is a container. At the replica's first
output the lazy mount's first-read order is saved as the image's prefetch
profile. Stopping removes the container and unmounts the image.

Container layout (binds, placeholders, limits): ``worker.runtimes.docker_launch``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
from docker.errors import DockerException, ImageNotFound

from snapshotter.errors import SnapshotterError
from snapshotter.images import get_image, image_layers, merge_layers, resolve_image
from snapshotter.registry import Registry
from worker.artifacts import cache_config, open_registry, store_config
from worker.child_protocol import FROM_CHILD, ContainerSpec, Hello, ReplicaSpec, StoreSpec
from worker.frames import FrameError, FrameSocket
from worker.lazyfs.config import MountConfig
from worker.lazyfs.mount import LazyMount, MountError
from worker.lazyfs.tree import build_tree
from worker.runtimes.base import CallRequest, CallUpdate, OnExit, ReplicaStartError, Runtime
from worker.runtimes.docker_launch import (
    ContainerPlan,
    ContainerProcess,
    Launched,
    placeholders,
    plan_container,
    remove_workdir,
    skeleton_tar,
    sock_dir,
)
from worker.runtimes.docker_stage import is_local, mirror_dir, mirror_spec, stage_artifacts
from worker.runtimes.process import GENERIC_PHASES, ProcessReplica

log = logging.getLogger(__name__)
HELLO_TIMEOUT_S = 120.0
CLOSE_WAIT_S = 180.0
DEFAULT_DOCKER_URL = "unix:///var/run/docker.sock"


def default_host_paths() -> list[str]:
    """The worker's interpreter, venv and code: bound read-only into every container."""
    code_root = str(Path(__file__).resolve().parents[2])
    paths = {code_root, sys.prefix, sys.base_prefix}
    return sorted(p for p in paths if not any(p != q and p.startswith(q + "/") for q in paths))


@dataclass(frozen=True)
class DockerConfig:
    store: StoreSpec  # the worker's store, cache and bundles (as the agent sends it)
    state_dir: Path  # mount points and sockets, one folder per replica
    python: str = sys.executable
    host_paths: tuple[str, ...] = ()  # default: default_host_paths()
    docker_url: str = DEFAULT_DOCKER_URL
    warm_size: int = 0  # pre-warmed containers per (image, device, limits)
    hello_timeout_s: float = HELLO_TIMEOUT_S


class DockerReplica(ProcessReplica):
    """A ``ProcessReplica`` whose process is a container; saves the image profile once."""

    process: ContainerProcess

    def __init__(self, replica_id: str, process: ContainerProcess, on_exit: OnExit) -> None:
        def exited(replica: str, reason: str) -> None:
            process.kill()  # the container died: release its mount and folder
            on_exit(replica, reason)

        super().__init__(replica_id, process, exited)
        self._profile_saved = threading.Event()

    def call(self, request: CallRequest) -> Iterator[CallUpdate]:
        for update in super().call(request):
            if not self._profile_saved.is_set():
                self._profile_saved.set()
                threading.Thread(target=self._save_profile, daemon=True).start()
            yield update

    def _save_profile(self) -> None:
        try:
            order = self.process.mount.save_profile()
            log.info("replica %s: image profile of %d files saved", self.replica_id, len(order))
        except MountError as exc:
            log.warning("replica %s: image profile not saved: %s", self.replica_id, exc)

    def profile_saved(self, timeout_s: float = 10.0) -> bool:
        return self._profile_saved.wait(timeout_s)


class DockerRuntime(Runtime):
    def __init__(self, config: DockerConfig) -> None:
        self.config = config
        self.host_paths = list(config.host_paths) or default_host_paths()
        self.registry: Registry = open_registry(config.store)
        self.client = docker.DockerClient(base_url=config.docker_url)
        self._lock = threading.Lock()
        self._warm: dict[tuple[str, str], list[ContainerProcess]] = {}
        self._closed = False
        self._refills: list[threading.Thread] = []

    # --- start -------------------------------------------------------------------
    def start(self, spec: ReplicaSpec, on_exit: OnExit) -> DockerReplica:
        container = spec.container
        if container is None:
            raise ReplicaStartError(f"replica {spec.replica_id} names no container image")
        store = self.config.store
        view = store if is_local(store) else mirror_spec(store, Path(mirror_dir(store)))
        spec = spec.model_copy(update={"store": view})
        phases: dict[str, float] = {}
        try:
            t0 = time.perf_counter()
            stage_artifacts(self.registry, spec, store)
            phases["weights_fetch"] = (time.perf_counter() - t0) * 1000
            t0 = time.perf_counter()
            process, warm = self._acquire(container, spec.device)
        except (SnapshotterError, MountError, DockerException, OSError, ValueError) as exc:
            raise ReplicaStartError(f"could not start a container: {exc}", phases) from None
        phases["pool_acquire"] = (time.perf_counter() - t0) * 1000 if warm else 0.0
        phases["image_fetch"] = 0.0 if warm else process.phases_ms.get("image_fetch", 0.0)
        for name in GENERIC_PHASES:
            phases[name] = 0.0 if warm else process.phases_ms.get(name, 0.0)
        replica = DockerReplica(spec.replica_id, process, on_exit)
        replica.specialize(spec, phases)
        return replica

    def _acquire(self, container: ContainerSpec, device: str) -> tuple[ContainerProcess, bool]:
        """A warm container of this image and limits, else a new one."""
        key = _pool_key(container, device)
        while True:
            with self._lock:
                warm = self._warm.get(key, [])
                process = warm.pop() if warm else None
            if process is None:
                return self.spawn(container, device), False
            if process.waiter.poll() is None:
                self._refill_later(container, device)
                return process, True
            process.kill()  # it died while waiting in the pool

    def prewarm(self, container: ContainerSpec, device: str = "cpu") -> None:
        """Fill the pool for this image and limits up to ``warm_size`` (blocking)."""
        key = _pool_key(container, device)
        while not self._closed:
            with self._lock:
                if len(self._warm.get(key, [])) >= self.config.warm_size:
                    return
            process = self.spawn(container, device)
            with self._lock:
                if self._closed:
                    process.kill()
                    return
                self._warm.setdefault(key, []).append(process)

    def _refill_later(self, container: ContainerSpec, device: str) -> None:
        thread = threading.Thread(target=self._refill, args=(container, device), daemon=True)
        with self._lock:
            self._refills = [t for t in self._refills if t.is_alive()] + [thread]
        thread.start()

    def _refill(self, container: ContainerSpec, device: str) -> None:
        try:
            self.prewarm(container, device)
        except (ReplicaStartError, SnapshotterError, MountError, DockerException, OSError) as exc:
            log.warning("could not pre-warm a container of %s: %s", container.image, exc)

    def warm_count(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._warm.values())

    # --- one container -----------------------------------------------------------
    def spawn(self, container: ContainerSpec, device: str) -> ContainerProcess:
        """Mount the image and start a generic replica in a container; wait for hello."""
        t0 = time.perf_counter()
        workdir = self.config.state_dir / uuid.uuid4().hex[:12]
        sock_dir(workdir).mkdir(parents=True)
        mount, plan, skeleton = self._prepare(container, device, workdir)
        image_fetch_ms = (time.perf_counter() - t0) * 1000
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(str(sock_dir(workdir) / "replica.sock"))
            listener.listen(1)
            handle = self._run(skeleton, plan)
        except BaseException:
            listener.close()
            mount.unmount()
            remove_workdir(workdir)
            raise
        try:
            conn, hello = self._await_hello(listener, handle)
        except BaseException:
            with contextlib.suppress(DockerException):
                handle.remove(force=True)
            mount.unmount()
            remove_workdir(workdir)
            raise
        finally:
            listener.close()
        hello_phases = {"image_fetch": image_fetch_ms, **hello.phases_ms}
        return ContainerProcess(handle, conn, device, hello_phases, mount, workdir)

    def launch(self, container: ContainerSpec, command: list[str]) -> Launched:
        """Run ``command`` in a container over the lazily mounted image; no replica protocol.

        For benchmarks and diagnostics; the caller ends it with ``Launched.close``.
        """
        workdir = self.config.state_dir / uuid.uuid4().hex[:12]
        sock_dir(workdir).mkdir(parents=True)
        mount, plan, skeleton = self._prepare(container, "cpu", workdir)
        try:
            handle = self._run(skeleton, dataclasses.replace(plan, command=command))
        except BaseException:
            mount.unmount()
            remove_workdir(workdir)
            raise
        return Launched(handle, mount, workdir)

    def ensure_root_image(self, image: str) -> str:
        """The skeleton root image of ``image`` (NAME:TAG), created once per image digest."""
        digest = resolve_image(self.registry, image)
        merged = merge_layers(image_layers(self.registry, get_image(self.registry, digest)))
        return self._skeleton(digest, build_tree(merged))

    def _prepare(
        self, container: ContainerSpec, device: str, workdir: Path
    ) -> tuple[LazyMount, ContainerPlan, str]:
        digest = resolve_image(self.registry, container.image)
        tree_base = merge_layers(image_layers(self.registry, get_image(self.registry, digest)))
        data_ro, data_rw = self._data_paths()
        extra_dirs, extra_files = placeholders(self.host_paths, data_ro + data_rw)
        mount = LazyMount.start(
            MountConfig.for_store(
                store_config(self.config.store), cache_config(self.config.store),
                mountpoint=str(workdir / "root"), image_digest=digest,
                control_socket=str(sock_dir(workdir) / "control.sock"),
                extra_dirs=extra_dirs, extra_files=extra_files,
            )
        )  # fmt: skip
        tree = build_tree(tree_base, extra_dirs=extra_dirs, extra_files=extra_files)
        plan = plan_container(
            tree=tree, mountpoint=str(mount.path), socket_dir=str(sock_dir(workdir)),
            python=self.config.python, host_paths=self.host_paths, data_ro=data_ro,
            data_rw=data_rw, child_args=["--device", device, "--spawned-at", repr(time.time())],
            env={}, network=container.network, memory_bytes=container.memory_bytes,
            cpus=container.cpus, gpus=device == "cuda", labels=self._labels(digest),
        )  # fmt: skip
        try:
            return mount, plan, self._skeleton(digest, tree)
        except BaseException:
            mount.unmount()
            raise

    def _labels(self, digest: str) -> dict[str, str]:
        # The state dir tells this worker's containers from other workers' on one engine.
        return {"thaw.image": digest, "thaw.state_dir": str(self.config.state_dir)}

    def _data_paths(self) -> tuple[list[str], list[str]]:
        store = self.config.store
        ro = [store.cache_dir]
        if "://" not in store.url:
            ro.append(str(Path(store.url).resolve()))
        Path(store.bundles_dir).mkdir(parents=True, exist_ok=True)
        return ro, [store.bundles_dir]

    def _skeleton(self, digest: str, tree: Any) -> str:
        tag = f"thaw-root:{digest.split(':', 1)[1][:16]}"
        try:
            self.client.images.get(tag)
        except ImageNotFound:
            repo, _, name = tag.partition(":")
            self.client.api.import_image_from_data(skeleton_tar(tree), repository=repo, tag=name)
        return tag

    def _run(self, image: str, plan: ContainerPlan) -> Any:
        from docker.types import DeviceRequest

        requests = [DeviceRequest(count=-1, capabilities=[["gpu"]])] if plan.gpus else None
        return self.client.containers.run(
            image, plan.command, detach=True, volumes=plan.volumes(), tmpfs=plan.tmpfs,
            environment=plan.env, network_mode=plan.network_mode, mem_limit=plan.mem_limit,
            nano_cpus=plan.nano_cpus, device_requests=requests, labels=plan.labels,
            working_dir="/", stdin_open=False,
        )  # fmt: skip

    def _await_hello(self, listener: socket.socket, handle: Any) -> tuple[FrameSocket, Hello]:
        listener.settimeout(0.2)
        deadline = time.monotonic() + self.config.hello_timeout_s
        while True:
            try:
                sock, _ = listener.accept()
                break
            except TimeoutError:
                handle.reload()
                if handle.status in ("exited", "dead") or time.monotonic() > deadline:
                    logs = handle.logs(tail=40).decode(errors="replace")
                    raise ReplicaStartError(
                        f"the replica container did not connect ({handle.status}); its output:\n"
                        f"{logs}"
                    ) from None
        sock.settimeout(self.config.hello_timeout_s)
        conn = FrameSocket(sock)
        try:
            msg = FROM_CHILD.validate_python(conn.recv())
        except (FrameError, OSError, ValueError) as exc:
            conn.close()
            raise ReplicaStartError(f"the replica container sent no hello: {exc}") from None
        sock.settimeout(None)
        if not isinstance(msg, Hello):
            conn.close()
            raise ReplicaStartError(f"the replica container sent {msg.type!r} before hello")
        return conn, msg

    def close(self, refill_wait_s: float = CLOSE_WAIT_S) -> None:
        """Remove warm containers; wait for refills in flight (they remove their own)."""
        with self._lock:
            self._closed = True
            refills = list(self._refills)
        for thread in refills:
            thread.join(refill_wait_s)
        with self._lock:
            warm = [p for v in self._warm.values() for p in v]
            self._warm.clear()
        for process in warm:
            process.kill()
        self.client.close()


def _pool_key(container: ContainerSpec, device: str) -> tuple[str, str]:
    return container.model_dump_json(), device
