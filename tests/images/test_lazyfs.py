"""Lazy FUSE mounts of pushed images: byte-identical to a full extraction; profiles."""

from __future__ import annotations

import io
import os
import random
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from snapshotter.config import CacheConfig, StoreConfig
from snapshotter.images import push_image_archive
from snapshotter.registry import Registry
from snapshotter.stores import open_store
from tests.fixtures.images import (
    Member,
    extract_layers,
    layer_tar,
    save_archive,
    tree_listing,
)
from worker.lazyfs.config import MountConfig
from worker.lazyfs.mount import LazyMount

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists("/dev/fuse"),
    reason="lazy mounts need /dev/fuse and root (make system-deps installs fuse3)",
)

CHUNK = 4096


def _layers() -> list[bytes]:
    rng = random.Random(7)
    big = rng.randbytes(5 * CHUNK + 123)
    lower = [
        Member("bin", "symlink", link="usr/bin"),
        Member("usr", "dir", mode=0o755),
        Member("usr/bin", "dir", mode=0o755),
        Member("usr/bin/tool", data=big, mode=0o4755),
        Member("usr/bin/tool-hard", "hardlink", link="usr/bin/tool", mode=0o4755),
        Member("usr/bin/sh", "symlink", link="/usr/bin/dash"),
        Member("usr/bin/dash", data=b"#!dash\n" * 50, mode=0o755),
        Member("usr/share/doc/empty", data=b""),
        Member("etc", "dir", mode=0o755),
        Member("etc/motd", data=b"welcome\n"),
        Member("etc/shadow", data=b"root:*:1:0\n", mode=0o640, gid=42),
        Member("var/cache/apt", "dir", mode=0o755),
        Member("var/cache/apt/pkgcache.bin", data=rng.randbytes(3000)),
        Member("opt/was-file", data=b"soon a directory"),
        Member("run/ctl", "fifo", mode=0o600),
    ]
    upper = [
        Member("etc/.wh.motd"),
        Member("var/cache/apt/.wh..wh..opq"),
        Member("var/cache/apt/fresh", data=b"fresh"),
        Member("opt/was-file", "dir", mode=0o750),
        Member("opt/was-file/now", data=b"inside"),
        Member("usr/bin/dash", data=b"#!new dash\n", mode=0o755),
        Member("app/main.py", data=b"print('hi')\n" * 400, uid=1000, gid=1000),
    ]
    return [layer_tar(lower), layer_tar(upper)]


@pytest.fixture
def pushed(tmp_path: Path) -> tuple[Registry, StoreConfig, str, list[bytes]]:
    store = StoreConfig(url=str(tmp_path / "store"))
    registry = Registry(open_store(store))
    layers = _layers()
    result = push_image_archive(
        io.BytesIO(save_archive(layers)), "lazy:v1", registry, chunk_size_bytes=CHUNK
    )
    return registry, store, result.digest, layers


def _mount(
    tmp_path: Path, store: StoreConfig, digest: str, *, cache: str = "cache", **fields: object
) -> LazyMount:
    name = uuid.uuid4().hex[:8]
    config = MountConfig.for_store(
        store,
        CacheConfig(directory=tmp_path / cache),
        mountpoint=str(tmp_path / f"mnt-{name}"),
        image_digest=digest,
        control_socket=str(tmp_path / f"ctl-{name}.sock"),
        **fields,
    )
    return LazyMount.start(config)


@pytest.fixture
def mounts() -> Iterator[list[LazyMount]]:
    held: list[LazyMount] = []
    yield held
    for m in held:
        m.unmount()


def test_lazy_mount_matches_full_extraction(
    pushed: tuple[Registry, StoreConfig, str, list[bytes]], tmp_path: Path, mounts: list[LazyMount]
) -> None:
    _, store, digest, layers = pushed
    extracted = tmp_path / "extracted"
    extract_layers(layers, extracted)
    mount = _mount(tmp_path, store, digest)
    mounts.append(mount)
    assert mount.stats().store_gets == 0  # nothing fetched until a file is read
    expected = tree_listing(extracted)
    assert "etc/motd" not in expected and "var/cache/apt/pkgcache.bin" not in expected
    assert tree_listing(mount.path) == expected
    # A ranged read across chunk boundaries.
    with open(mount.path / "usr/bin/tool", "rb") as f:
        f.seek(CHUNK - 10)
        part = f.read(CHUNK + 20)
    assert part == (extracted / "usr/bin/tool").read_bytes()[CHUNK - 10 : 2 * CHUNK + 10]


def test_mount_is_read_only(
    pushed: tuple[Registry, StoreConfig, str, list[bytes]], tmp_path: Path, mounts: list[LazyMount]
) -> None:
    _, store, digest, _ = pushed
    mount = _mount(tmp_path, store, digest)
    mounts.append(mount)
    with pytest.raises(OSError):
        (mount.path / "app/main.py").write_text("changed")
    with pytest.raises(OSError):
        (mount.path / "new-file").write_text("x")


def test_placeholders_for_mount_points(
    pushed: tuple[Registry, StoreConfig, str, list[bytes]], tmp_path: Path, mounts: list[LazyMount]
) -> None:
    _, store, digest, _ = pushed
    mount = _mount(
        tmp_path, store, digest, extra_dirs=["/work/venv", "/etc"], extra_files=["/etc/hosts"]
    )
    mounts.append(mount)
    assert (mount.path / "work/venv").is_dir()
    assert (mount.path / "etc/hosts").read_bytes() == b""
    assert (mount.path / "etc/shadow").stat().st_gid == 42  # existing entries untouched


def test_second_start_follows_recorded_profile(
    pushed: tuple[Registry, StoreConfig, str, list[bytes]], tmp_path: Path, mounts: list[LazyMount]
) -> None:
    registry, store, digest, _ = pushed
    start_order = ["app/main.py", "usr/bin/dash", "usr/bin/tool", "etc/shadow"]
    first = _mount(tmp_path, store, digest, cache="cache1")
    mounts.append(first)
    for rel in start_order:
        (first.path / rel).read_bytes()
    assert first.save_profile() == start_order
    (first.path / "var/cache/apt/fresh").read_bytes()  # after first output: not recorded
    first.unmount()
    assert registry.get_profile(digest) == start_order

    second = _mount(tmp_path, store, digest, cache="cache2", prefetch_threads=1)
    mounts.append(second)
    assert second.wait_prefetch(timeout_s=30)
    stats = second.stats()
    assert stats.prefetch_started == start_order
    assert stats.prefetch_errors == []
    fetched = stats.store_gets
    assert fetched > 0
    for rel in start_order:
        (second.path / rel).read_bytes()
    assert second.stats().store_gets == fetched  # every profiled file was already here
    (second.path / "var/cache/apt/fresh").read_bytes()
    assert second.stats().store_gets == fetched + 1


def test_reads_go_through_the_disk_cache(
    pushed: tuple[Registry, StoreConfig, str, list[bytes]], tmp_path: Path, mounts: list[LazyMount]
) -> None:
    _, store, digest, _ = pushed
    first = _mount(tmp_path, store, digest, prefetch=False)
    mounts.append(first)
    data = (first.path / "usr/bin/tool").read_bytes()
    assert first.stats().store_gets == 6
    first.unmount()
    second = _mount(tmp_path, store, digest, prefetch=False)
    mounts.append(second)
    assert (second.path / "usr/bin/tool").read_bytes() == data
    stats = second.stats()
    assert (stats.store_gets, stats.cache_hits) == (0, 6)
