"""Fixtures for tests on the real Docker engine: the base image pushed as chunks."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from snapshotter.config import StoreConfig
from snapshotter.images import push_image_archive
from snapshotter.registry import Registry
from snapshotter.stores import open_store
from tests.fixtures.images import docker_available, ensure_base_image
from worker.child_protocol import StoreSpec


@pytest.fixture(scope="session")
def engine_image() -> str:
    if not docker_available():
        pytest.skip("no Docker engine (make system-deps installs and starts one)")
    return ensure_base_image()


@pytest.fixture(scope="session")
def image_store(tmp_path_factory: pytest.TempPathFactory, engine_image: str) -> StoreConfig:
    """A local store holding ``engine_image`` pushed as ``base:v1`` (once per session)."""
    store = StoreConfig(url=str(tmp_path_factory.mktemp("docker-store") / "store"))
    registry = Registry(open_store(store))
    with subprocess.Popen(["docker", "save", engine_image], stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        push_image_archive(proc.stdout, "base:v1", registry)
    assert proc.returncode == 0
    return store


@pytest.fixture
def store_spec(image_store: StoreConfig, tmp_path: Path) -> StoreSpec:
    return StoreSpec(
        url=image_store.url,
        cache_dir=str(tmp_path / "cache"),
        cache_max_bytes=4 << 30,
        bundles_dir=str(tmp_path / "bundles"),
    )


def containers_under(root: Path, *, running_only: bool = False) -> list[str]:
    """Replica containers whose worker state lives under ``root`` (other runs ignored)."""
    fmt = '{{.ID}} {{.Label "thaw.state_dir"}}'
    cmd = ["docker", "ps", "--filter", "label=thaw.state_dir", "--format", fmt]
    if not running_only:
        cmd.insert(2, "-a")
    out = subprocess.run(cmd, capture_output=True, text=True).stdout
    rows = [line.split(" ", 1) for line in out.splitlines() if " " in line]
    return [cid for cid, state in rows if state.startswith(str(root))]


@pytest.fixture(autouse=True)
def no_leftover_containers(tmp_path: Path) -> Iterator[None]:
    yield
    if docker_available():
        assert containers_under(tmp_path) == [], "a test left a replica container behind"
