"""Two control-plane instances on one database (as behind a load balancer): a
result recorded through one wakes a caller waiting on the other (database
polling), and concurrent invokes through both start one replica, not two."""

from __future__ import annotations

import threading
from collections.abc import Callable

import httpx

from control_plane.dispatch.memory import InMemoryDispatcher
from tests.control_plane.conftest import ControlPlane


def test_two_instances_share_calls_and_start_one_replica(
    cp_factory: Callable[..., ControlPlane],
) -> None:
    dispatcher = InMemoryDispatcher()
    a = cp_factory(dispatcher=dispatcher)
    b = cp_factory(dispatcher=dispatcher)
    worker = a.worker(start_delay_s=0.3)  # registers and reports through A only
    a.deploy("echo", scaling={"max_replicas": 4, "target_concurrency": 8})
    results: list[httpx.Response] = []

    def invoke(cp: ControlPlane, i: int) -> None:
        with cp.client() as c:
            results.append(c.post("/v1/functions/echo/invoke", json={"input": i}))

    threads = [threading.Thread(target=invoke, args=(cp, i)) for i, cp in enumerate([a, b] * 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.status_code for r in results] == [200] * 6
    assert sorted(r.json()["output"]["echo"] for r in results) == list(range(6))
    starts = [p for task, p in worker.received if task == "thaw.start_replica"]
    assert len(starts) == 1
