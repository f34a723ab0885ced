"""Storage fault 14: the worker's cache disk fills during a load.

A real 512 KiB tmpfs holds the cache (mounting needs root; skipped otherwise). The
load completes from the store and leaves no partial entry; the worker agent reports
itself unhealthy in its heartbeat, with the reason, and the scheduler places no new
replica on it until space returns.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import StaticPool

from control_plane.db.models import Base
from control_plane.errors import NoCapacityError
from control_plane.protocol import WorkerHeartbeat, WorkerRegister
from control_plane.services import workers
from control_plane.services.scheduler import ReplicaRequest, place
from snapshotter.cache import DiskCache
from snapshotter.config import CacheConfig
from snapshotter.digest import digest_bytes
from snapshotter.loader import Snapshotter
from snapshotter.push import push_directory
from snapshotter.registry import Registry
from snapshotter.stores.local import LocalStore
from tests.faults.storage_kit import WAIT_S, write_random_model
from tests.snapshotter.loadkit import assert_same_tensors, entry_payload_at, expected_tensors
from tests.worker.recorder import Recorder
from tests.worker.test_replicas import LocalCodeRuntime
from worker.agent import Agent, AgentConfig
from worker.child_protocol import StoreSpec
from worker.consumer import BrokerConfig


@pytest.fixture(scope="module")
def big_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_model(tmp_path_factory.mktemp("big") / "model")


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 512 KiB filesystem (tmpfs, mounted as root) to hold the worker's cache."""
    mount = tmp_path / "cachefs"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()}); needs root")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def _fill_cache_by_loading(registry: Registry, cache_dir: Path, model_dir: Path) -> None:
    """A load whose cache disk fills midway: it completes from the store, leaves no
    partial entry, and says why chunks were not cached."""
    loader = Snapshotter(registry, DiskCache(CacheConfig(cache_dir, max_bytes=1 << 30)))
    assert_same_tensors(loader.load("big:v1"), expected_tensors(model_dir))
    assert loader.source.counters().cache_write_errors > 0
    entries = [p for p in (cache_dir / "chunks").rglob("*") if p.is_file()]
    assert entries and not [p for p in entries if p.name.startswith(".tmp-")]
    for path in entries:  # what was cached is whole
        assert digest_bytes(path.read_bytes()[entry_payload_at(path) :]) == f"blake3:{path.name}"


def _heartbeats(recorder: Recorder, worker_id: str, healthy: bool) -> dict[str, Any]:
    path = f"/v1/workers/{worker_id}/heartbeat"
    return recorder.wait_for(path, lambda b: b["healthy"] is healthy)[-1]


def _placed_on(session: Session, heartbeat: dict[str, Any]) -> str:
    """Record ``heartbeat`` as the control plane does; where would a new replica go?"""
    workers.heartbeat(session, 1.0, "w1", WorkerHeartbeat.model_validate(heartbeat))
    return place(ReplicaRequest("f", "cpu"), workers.snapshots(session)).worker_id


def _agent(tmp_path: Path, cache_dir: Path, recorder: Recorder) -> Agent:
    """A real agent (Celery over the filesystem broker) whose cache is ``cache_dir``."""
    store = StoreSpec(url="unused", cache_dir=str(cache_dir), cache_max_bytes=0, bundles_dir="x")
    config = AgentConfig(
        state_dir=tmp_path / "worker",
        server_url="http://cp.test",
        api_key="k",
        broker=BrokerConfig("filesystem://", tmp_path / "broker", 0.02),
        store=store,
        concurrency=2,
        cache_min_free_bytes=64 << 10,
    )
    return Agent(config, LocalCodeRuntime(), recorder.client())


def test_cache_disk_full_during_a_load_makes_the_worker_unhealthy_until_space_returns(
    big_model_dir: Path, tiny_disk: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    registry = Registry(LocalStore(tmp_path / "store"))
    push_directory(big_model_dir, "big:v1", registry, chunk_size_bytes=64 << 10)
    cache_dir = tiny_disk / "cache"
    with caplog.at_level(logging.WARNING):
        _fill_cache_by_loading(registry, cache_dir, big_model_dir)
    assert any("the cache disk is full" in r.getMessage() for r in caplog.records)

    recorder = Recorder()
    agent = _agent(tmp_path, cache_dir, recorder)
    engine = create_engine("sqlite://", poolclass=StaticPool)
    Base.metadata.create_all(engine)
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,))
    thread.start()
    try:
        with Session(engine) as session:
            workers.register(session, None, 0.0, WorkerRegister(worker_id="w1"))
            sick = _heartbeats(recorder, agent.worker_id, healthy=False)
            assert str(cache_dir) in sick["unhealthy_reason"]
            assert "bytes free" in sick["unhealthy_reason"]
            with pytest.raises(NoCapacityError, match="no healthy worker"):
                _placed_on(session, sick)

            shutil.rmtree(cache_dir / "chunks")  # space comes back
            well = _heartbeats(recorder, agent.worker_id, healthy=True)
            assert well["unhealthy_reason"] is None
            assert _placed_on(session, well) == "w1"
    finally:
        stop.set()
        thread.join(WAIT_S)
    assert not thread.is_alive()
