"""Generic processes: the pool hands out warm ones and refills; a bad start is explained."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from worker.child_protocol import ReplicaSpec
from worker.pool import ProcessPool, SpawnError, spawn_generic
from worker.runtimes.base import CallRequest
from worker.runtimes.process import ProcessRuntime

FUNCTIONS = Path(__file__).parent / "functions"


def test_warm_process_skips_generic_phases_and_the_pool_refills() -> None:
    pool = ProcessPool(warm_size=1)
    runtime = ProcessRuntime(pool)
    try:
        runtime.prewarm_device("cpu")
        assert pool.size() == 1
        warm_pid = pool._warm["cpu"][0].pid
        spec = ReplicaSpec(
            replica_id="r1", function="f", entry="basic:Flaky", bundle_dir=str(FUNCTIONS)
        )
        replica = runtime.start(spec, lambda *_: None)
        assert replica.process.pid == warm_pid
        assert replica.phases_ms["process_start"] == 0.0  # paid before the request
        assert replica.phases_ms["pool_acquire"] > 0.0
        assert [u.kind for u in replica.call(CallRequest("c1", {}))] == ["succeeded"]
        deadline = time.monotonic() + 60
        while pool.size() < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pool.size() == 1 and pool._warm["cpu"][0].pid != warm_pid
        replica.stop()
    finally:
        runtime.close()
    assert pool.size() == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_on_a_machine_without_it_says_so() -> None:
    with pytest.raises(SpawnError, match="torch sees no CUDA device"):
        spawn_generic("cuda")
