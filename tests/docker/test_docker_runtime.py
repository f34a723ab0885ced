"""The Docker runtime on the real engine: replicas in containers over lazy image mounts."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from snapshotter.config import CacheConfig, StoreConfig
from snapshotter.images import resolve_image
from snapshotter.registry import Registry
from snapshotter.stores import open_store
from tests.fixtures.images import tree_listing
from worker.child_protocol import ContainerSpec, ReplicaSpec, StoreSpec
from worker.lazyfs.config import MountConfig
from worker.lazyfs.mount import LazyMount
from worker.runtimes.base import CallRequest, CallUpdate, ReplicaStartError
from worker.runtimes.docker import DockerConfig, DockerReplica, DockerRuntime

FUNCTIONS = Path(__file__).parent / "functions"
pytestmark = pytest.mark.timeout(600)


class Exits:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.event = threading.Event()

    def __call__(self, replica_id: str, reason: str) -> None:
        self.calls.append((replica_id, reason))
        self.event.set()


@pytest.fixture
def runtime(store_spec: StoreSpec, tmp_path: Path) -> Iterator[DockerRuntime]:
    rt = DockerRuntime(DockerConfig(store=store_spec, state_dir=tmp_path / "state"))
    yield rt
    rt.close()


def spec(replica_id: str = "r1", image: str = "base:v1", **container: Any) -> ReplicaSpec:
    return ReplicaSpec(
        replica_id=replica_id,
        function="info",
        entry="imageapp:ImageInfo",
        bundle_dir=str(FUNCTIONS),
        container=ContainerSpec(image=image, **container),
    )


def call(replica: DockerReplica, input: Any, call_id: str = "c1") -> CallUpdate:
    updates = list(replica.call(CallRequest(call_id=call_id, input=input, timeout_s=60)))
    assert updates[-1].kind == "succeeded", updates[-1].error
    return updates[-1]


def test_replica_runs_over_the_lazy_image_without_network(runtime: DockerRuntime) -> None:
    replica = runtime.start(spec(memory_bytes=512 << 20), Exits())
    try:
        for phase in ("image_fetch", "process_start", "imports", "device_init", "user_setup"):
            assert phase in replica.phases_ms, phase
        out = call(replica, {}).output
        assert out["debian_version"].startswith("12.")
        assert out["network"] is False
        assert out["cgroup_memory"] == 512 << 20
        assert out["root_writable"] is False
        assert out["tmp_writable"] is True
        stats = replica.process.mount.stats()
        assert stats.files_read > 0
        assert stats.store_gets > 0  # the container's reads came through the lazy mount
        image_file = call(replica, {"read": "/usr/lib/os-release"}, "c2").output["bytes"]
        assert bytes.fromhex(image_file).startswith(b'PRETTY_NAME="Debian GNU/Linux 12')
    finally:
        replica.stop()
    assert not replica.alive


def test_network_when_the_spec_allows_it(runtime: DockerRuntime) -> None:
    replica = runtime.start(spec(network=True), Exits())
    try:
        assert call(replica, {}).output["network"] is True
    finally:
        replica.stop()


def test_profile_saved_at_first_output_and_followed_next_start(runtime: DockerRuntime) -> None:
    first = runtime.start(spec("r1"), Exits())
    try:
        call(first, {})
        assert first.profile_saved()
    finally:
        first.stop()
    digest = resolve_image(runtime.registry, "base:v1")
    profile = runtime.registry.get_profile(digest)
    assert profile, "the first start recorded no profile"
    assert "usr/lib/os-release" not in profile  # read after the first output only
    second = runtime.start(spec("r2"), Exits())
    try:
        assert second.process.mount.wait_prefetch(timeout_s=60)
        started = second.process.mount.stats().prefetch_started
        assert started == [p for p in profile if p in started]
        assert len(started) == len(profile)
    finally:
        second.stop()


def test_call_past_its_deadline_kills_the_container(runtime: DockerRuntime) -> None:
    replica = runtime.start(spec(), Exits())
    request = CallRequest(call_id="slow", input={"sleep_s": 60}, timeout_s=2)
    updates = list(replica.call(request))
    assert updates[-1].kind == "timeout"
    replica.stop()
    assert not replica.alive
    assert not replica.process.mount.mounted


def test_container_dying_reports_on_exit(runtime: DockerRuntime) -> None:
    exits = Exits()
    replica = runtime.start(spec(), exits)
    replica.process.container.kill()  # as the engine would on OOM
    assert exits.event.wait(30)
    assert exits.calls[0][0] == "r1"
    assert not replica.alive
    assert not replica.process.mount.mounted


def test_prewarmed_container_joins_the_pool(store_spec: StoreSpec, tmp_path: Path) -> None:
    rt = DockerRuntime(DockerConfig(store=store_spec, state_dir=tmp_path / "state", warm_size=1))
    try:
        container = ContainerSpec(image="base:v1")
        rt.prewarm(container)
        assert rt.warm_count() == 1
        replica = rt.start(spec(), Exits())
        try:
            assert replica.phases_ms["process_start"] == 0.0
            assert replica.phases_ms["image_fetch"] == 0.0
            assert "pool_acquire" in replica.phases_ms
            assert call(replica, {}).output["debian_version"].startswith("12.")
        finally:
            replica.stop()
    finally:
        rt.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_replica_gets_the_gpus_by_device_request(runtime: DockerRuntime) -> None:
    replica = runtime.start(spec().model_copy(update={"device": "cuda"}), Exits())
    try:
        assert call(replica, {}).output["device"] == "cuda"
        assert replica.process.container.attrs["HostConfig"]["DeviceRequests"]
    finally:
        replica.stop()


def test_unknown_image_fails_the_start(runtime: DockerRuntime) -> None:
    with pytest.raises(ReplicaStartError, match="thaw images push"):
        runtime.start(spec(image="nope:v1"), Exits())


# What the engine's init layer adds to every container (so `docker export` shows it).
ENGINE_PATHS = (
    "dev", "proc", "sys", ".dockerenv", "etc/hosts", "etc/hostname", "etc/resolv.conf", "etc/mtab",
)  # fmt: skip


def test_lazy_mount_matches_the_engines_own_extraction(
    image_store: StoreConfig, engine_image: str, tmp_path: Path
) -> None:
    """``docker export`` of the image is the ground truth; the mount must match it byte for byte."""
    exported = tmp_path / "exported"
    exported.mkdir()
    container = subprocess.run(
        ["docker", "create", engine_image], capture_output=True, text=True, check=True
    ).stdout.strip()
    try:
        with subprocess.Popen(["docker", "export", container], stdout=subprocess.PIPE) as proc:
            subprocess.run(["tar", "-C", str(exported), "-xpf", "-"], stdin=proc.stdout, check=True)
    finally:
        subprocess.run(["docker", "rm", container], capture_output=True, check=True)
    registry = Registry(open_store(image_store))
    config = MountConfig.for_store(
        image_store,
        CacheConfig(directory=tmp_path / "cache"),
        mountpoint=str(tmp_path / "mnt"),
        image_digest=resolve_image(registry, "base:v1"),
        control_socket=str(tmp_path / "ctl.sock"),
    )
    with LazyMount.start(config) as mount:
        lazy = _without_engine_paths(tree_listing(mount.path))
    expected = _without_engine_paths(tree_listing(exported))
    assert len(expected) > 1000
    assert lazy == expected


def _without_engine_paths(listing: dict[str, tuple[object, ...]]) -> dict[str, tuple[object, ...]]:
    return {
        path: v
        for path, v in listing.items()
        if not any(path == p or path.startswith(p + "/") for p in ENGINE_PATHS)
    }
