"""The container plan is pure: checked without an engine."""

from __future__ import annotations

import io
import tarfile

from snapshotter.layers import TocEntry
from worker.lazyfs.tree import build_tree
from worker.runtimes.docker_launch import (
    CONTAINER_SOCKET_DIR,
    ContainerPlan,
    placeholders,
    plan_container,
    skeleton_tar,
)

MERGED = {
    "bin": TocEntry("bin", "symlink", link="usr/bin"),
    "usr": TocEntry("usr", "dir", mode=0o755),
    "usr/bin": TocEntry("usr/bin", "dir", mode=0o755),
    "etc": TocEntry("etc", "dir", mode=0o755),
    "proc": TocEntry("proc", "dir", mode=0o555),
    "tmp": TocEntry("tmp", "dir", mode=0o1777),
    "root": TocEntry("root", "dir", mode=0o700),
}


def _plan(**kw: object) -> ContainerPlan:
    host = ["/work/main", "/root/.pyenv/versions/3.11.7"]
    dirs, files = placeholders(host, ["/var/cache/thaw"])
    args: dict[str, object] = dict(
        tree=build_tree(MERGED, extra_dirs=dirs, extra_files=files), mountpoint="/m",
        socket_dir="/tmp/thaw-x", python="/work/main/.venv/bin/python", host_paths=host,
        data_ro=["/var/cache/thaw"], data_rw=["/srv/bundles"], child_args=["--device", "cpu"],
        env={"A": "1"}, network=False, memory_bytes=1 << 30, cpus=1.5, gpus=False, labels={},
    )  # fmt: skip
    args.update(kw)
    return plan_container(**args)  # type: ignore[arg-type]


def test_no_network_limits_and_read_only_image() -> None:
    plan = _plan()
    assert plan.network_mode == "none"
    assert (plan.mem_limit, plan.nano_cpus, plan.gpus) == (1 << 30, 1_500_000_000, False)
    binds = {b.target: b for b in plan.binds}
    assert binds["/usr"].source == "/m/usr" and binds["/usr"].read_only
    assert binds["/etc"].read_only and binds["/root"].read_only
    assert "/bin" not in binds  # a top-level link lives in the skeleton image
    assert "/proc" not in binds and "/tmp" not in binds  # the engine's, and tmpfs
    assert binds["/work/main"].read_only and binds["/var/cache/thaw"].read_only
    assert not binds["/srv/bundles"].read_only
    assert binds[CONTAINER_SOCKET_DIR].source == "/tmp/thaw-x"
    assert set(plan.tmpfs) == {"/tmp", "/run"}
    assert plan.command[:2] == ["/work/main/.venv/bin/python", "-c"]
    assert plan.command[3:] == [f"{CONTAINER_SOCKET_DIR}/replica.sock", "--device", "cpu"]


def test_network_and_gpus_when_asked() -> None:
    plan = _plan(network=True, gpus=True, memory_bytes=None, cpus=None)
    assert plan.network_mode is None and plan.gpus
    assert plan.mem_limit is None and plan.nano_cpus is None


def test_placeholders_make_mount_points_without_touching_the_image() -> None:
    dirs, files = placeholders(["/work/main"], [])
    tree = build_tree(MERGED, extra_dirs=dirs, extra_files=files)
    work = tree.node("work/main")
    assert work is not None and work.is_dir
    hosts = tree.node("etc/hosts")
    assert hosts is not None and hosts.entry.size == 0
    root = tree.node("root")
    assert root is not None and root.entry.mode == 0o700


def test_skeleton_holds_links_and_empty_top_level_dirs() -> None:
    tree = build_tree(MERGED)
    with tarfile.open(fileobj=io.BytesIO(skeleton_tar(tree))) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert members["bin"].issym() and members["bin"].linkname == "usr/bin"
    assert members["usr"].isdir() and members["proc"].isdir() and members["run"].isdir()
    assert not any("/" in name for name in members)
    assert all(m.size == 0 for m in members.values())
