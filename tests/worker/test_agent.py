"""The agent end to end on its side: Celery over the filesystem broker, real replicas.

The control plane is the recorder; messages go through the control plane's
own ``CeleryDispatcher`` into this worker's queue.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from control_plane.dispatch.celery_app import make_celery
from control_plane.dispatch.celery_dispatcher import CeleryDispatcher
from control_plane.protocol import RunCall, StartReplica, StopReplica
from tests.worker.recorder import Recorder
from tests.worker.test_replicas import BUNDLE, LocalCodeRuntime
from worker.agent import Agent, AgentConfig, worker_id
from worker.child_protocol import StoreSpec
from worker.consumer import BrokerConfig


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[Agent, Recorder, CeleryDispatcher, threading.Event]]:
    recorder = Recorder()
    broker = BrokerConfig("filesystem://", tmp_path / "broker", 0.02)
    config = AgentConfig(
        state_dir=tmp_path / "worker",
        server_url="http://cp.test",
        api_key="k",
        broker=broker,
        store=StoreSpec(url="unused", cache_dir="unused", cache_max_bytes=0, bundles_dir="unused"),
        concurrency=4,
    )
    runtime = LocalCodeRuntime()
    agent = Agent(config, runtime, recorder.client())
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,))
    thread.start()
    dispatcher = CeleryDispatcher(make_celery(broker.url, broker.folder, 0.02))
    yield agent, recorder, dispatcher, stop
    stop.set()
    thread.join(timeout=30)
    dispatcher.close()
    assert not thread.is_alive()


def test_worker_id_is_made_once_and_kept(tmp_path: Path) -> None:
    first = worker_id(tmp_path)
    assert worker_id(tmp_path) == first and len(first) == 32


def test_register_consume_heartbeat_and_stop(
    running: tuple[Agent, Recorder, CeleryDispatcher, threading.Event],
) -> None:
    agent, recorder, dispatcher, _ = running
    [reg] = recorder.wait_for("/v1/workers/register", lambda e: True)
    assert reg["worker_id"] == agent.worker_id and reg["devices"][0]["kind"] in ("cpu", "cuda")
    assert reg["memory_bytes"] > 0
    start = StartReplica(
        replica_id="r1", function="f", version=1, bundle_digest=BUNDLE, entry="basic:Stream"
    )
    dispatcher.start_replica(agent.worker_id, start)
    recorder.wait_for("/v1/replicas/r1/", lambda e: e["state"] == "ready")
    dispatcher.run_call(
        agent.worker_id,
        RunCall(
            call_id="c1",
            replica_id="r1",
            function="f",
            input={"n": 2},
            stream=True,
            accepted_at=time.time(),
        ),
    )
    events = recorder.wait_for("/v1/calls/c1/", lambda e: e["kind"] == "succeeded")
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "started" and kinds[-1] == "succeeded"
    # Both chunks, in order: one event each, or one event with both when the second
    # was made while the first was being reported.
    outputs = [e for e in events if e["kind"] == "output"]
    chunks = [c for e in outputs for c in (e["outputs"] or [e["output"]])]
    assert len(chunks) == 2 and kinds[1:-1] == ["output"] * len(outputs)
    assert [e["seq"] for e in outputs] == ([1, 2] if len(outputs) == 2 else [1])
    beats = recorder.wait_for(
        f"/v1/workers/{agent.worker_id}/heartbeat",
        lambda e: [r["state"] for r in e["replicas"]] == ["ready"],
    )
    assert beats[-1]["free_memory_bytes"] > 0
    # No warm processes (warm size 0), one serving as r1; no inventory: no holdings.
    assert (beats[-1]["pool_idle"], beats[-1]["pool_busy"], beats[-1]["holdings"]) == (0, 1, [])
    assert beats[-1]["bandwidths"]["store_bytes_per_s"] is None
    dispatcher.stop_replica(agent.worker_id, StopReplica(replica_id="r1", reason="idle"))
    recorder.wait_for("/v1/replicas/r1/", lambda e: e["state"] == "stopped")


def test_shutdown_stops_running_replicas(
    running: tuple[Agent, Recorder, CeleryDispatcher, threading.Event],
) -> None:
    agent, recorder, dispatcher, stop = running
    recorder.wait_for("/v1/workers/register", lambda e: True)
    start = StartReplica(
        replica_id="r2", function="f", version=1, bundle_digest=BUNDLE, entry="basic:Echo"
    )
    dispatcher.start_replica(agent.worker_id, start)
    recorder.wait_for("/v1/replicas/r2/", lambda e: e["state"] == "ready")
    stop.set()
    events = recorder.wait_for("/v1/replicas/r2/", lambda e: e["state"] == "stopped")
    assert "shutting down" in events[-1]["error"]


def test_heartbeat_orders_stop_a_replica(
    running: tuple[Agent, Recorder, CeleryDispatcher, threading.Event],
) -> None:
    agent, recorder, dispatcher, _ = running
    recorder.wait_for("/v1/workers/register", lambda e: True)
    start = StartReplica(
        replica_id="r3", function="f", version=1, bundle_digest=BUNDLE, entry="basic:Echo"
    )
    dispatcher.start_replica(agent.worker_id, start)
    recorder.wait_for("/v1/replicas/r3/", lambda e: e["state"] == "ready")
    recorder.heartbeat_reply = {"cancel_call_ids": [], "stop_replica_ids": ["r3"]}
    recorder.wait_for("/v1/replicas/r3/", lambda e: e["state"] == "stopped")


def test_an_unknown_worker_registers_again(
    running: tuple[Agent, Recorder, CeleryDispatcher, threading.Event],
) -> None:
    _, recorder, _, _ = running
    recorder.wait_for("/v1/workers/register", lambda e: True)
    recorder.heartbeat_status = 404  # e.g. the control plane's database was reset
    recorder.wait_for(
        "/v1/workers/register", lambda e: len(recorder.events("/v1/workers/register")) >= 2
    )
