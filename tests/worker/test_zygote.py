"""Generic processes forked from the zygote: no imports paid per process, their
own random state, exit codes from the zygote, and replicas that outlive it."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from worker.child_protocol import ReplicaSpec
from worker.pool import ProcessPool
from worker.runtimes.base import CallRequest
from worker.runtimes.process import ProcessRuntime
from worker.zygote import ForkedProcess

FUNCTIONS = Path(__file__).parent / "functions"


def spec(entry: str, replica_id: str) -> ReplicaSpec:
    return ReplicaSpec(replica_id=replica_id, function="f", entry=entry, bundle_dir=str(FUNCTIONS))


def parent_pid(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])  # the field after the state


@pytest.fixture
def pool() -> Iterator[ProcessPool]:
    pool = ProcessPool(warm_size=0, zygote=True)
    pool.start_zygote()
    yield pool
    pool.close()


def test_a_start_that_waits_for_the_zygote_counts_the_wait_as_imports() -> None:
    """The worker's first start can come while its zygote still imports the preload
    (the pool warms in the background): the start waits, and its phases say so."""
    pool = ProcessPool(warm_size=0, zygote=True)
    try:
        warming = threading.Thread(target=pool.start_zygote)
        warming.start()
        while pool._zygote is None and not pool._zygote_lock.locked():
            time.sleep(0.001)
        t0 = time.perf_counter()
        replica = ProcessRuntime(pool).start(spec("basic:Echo", "r0"), lambda *_: None)
        elapsed_ms = (time.perf_counter() - t0) * 1000
        warming.join()
        try:
            assert isinstance(replica.process.proc, ForkedProcess)
            generic = sum(replica.phases_ms[p] for p in ("process_start", "imports"))
            assert pool._zygote is not None and pool._zygote.imports_ms > 0.0
            # what the start spent before its process ran is in its phases
            assert replica.phases_ms["imports"] >= pool._zygote.imports_ms / 2
            assert generic <= elapsed_ms
        finally:
            replica.stop()
    finally:
        pool.close()


def test_a_pool_miss_is_a_fork_of_the_zygote(pool: ProcessPool) -> None:
    runtime = ProcessRuntime(pool)
    assert pool._zygote is not None
    zygote_pid = pool._zygote.proc.pid
    assert pool._zygote.imports_ms > 0.0  # torch, paid once by the zygote
    replica = runtime.start(spec("basic:Echo", "r1"), lambda *_: None)
    try:
        assert isinstance(replica.process.proc, ForkedProcess)
        assert parent_pid(replica.process.pid) == zygote_pid
        phases = replica.phases_ms
        assert phases["pool_acquire"] == 0.0  # a miss: nothing was waiting
        # What remains of ``imports`` is the function's own module; torch came with the fork.
        assert phases["imports"] < pool._zygote.imports_ms / 4
        assert 0.0 < phases["process_start"] < pool._zygote.imports_ms
        [done] = list(replica.call(CallRequest("c1", {"x": 1})))
        assert done.kind == "succeeded" and done.output["input"] == {"x": 1}
    finally:
        replica.stop()
    assert replica.process.proc.poll() is not None
    assert not Path(f"/proc/{replica.process.pid}").exists()  # reaped by the zygote


def test_forked_processes_draw_their_own_random_numbers(pool: ProcessPool) -> None:
    runtime = ProcessRuntime(pool)
    replicas = [runtime.start(spec("basic:Random", f"r{i}"), lambda *_: None) for i in range(2)]
    try:
        [a], [b] = ([u.output for u in r.call(CallRequest("c", {}))] for r in replicas)
    finally:
        for r in replicas:
            r.stop()
    assert a["pid"] != b["pid"]
    assert a["random"] != b["random"] and a["torch"] != b["torch"]


def test_a_killed_fork_reports_the_signal(pool: ProcessPool) -> None:
    exits: list[str] = []
    runtime = ProcessRuntime(pool)
    replica = runtime.start(spec("basic:Flaky", "r1"), lambda _, why: exits.append(why))
    os.kill(replica.process.pid, signal.SIGSEGV)
    assert replica.process.proc.wait(timeout=10) == -signal.SIGSEGV
    deadline = time.monotonic() + 10
    while not exits and time.monotonic() < deadline:
        time.sleep(0.05)
    assert exits == ["the replica process exited with code -11"]


def test_replicas_outlive_a_dead_zygote_and_a_new_one_starts(pool: ProcessPool) -> None:
    runtime = ProcessRuntime(pool)
    replica = runtime.start(spec("basic:Flaky", "r1"), lambda *_: None)
    assert pool._zygote is not None
    first = pool._zygote
    first.proc.kill()
    first.proc.wait()
    deadline = time.monotonic() + 10
    while first.alive and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not first.alive
    # The replica still serves; its end is seen through its pidfd.
    assert [u.kind for u in replica.call(CallRequest("c1", {}))] == ["succeeded"]
    replica.process.proc.kill()
    assert replica.process.proc.wait(timeout=10) == -signal.SIGKILL
    # The next start forks from a new zygote.
    again = runtime.start(spec("basic:Flaky", "r2"), lambda *_: None)
    try:
        assert pool._zygote is not None and pool._zygote is not first
        assert parent_pid(again.process.pid) == pool._zygote.proc.pid
    finally:
        again.stop()


def test_a_fork_leaves_the_zygotes_objects_to_the_zygote(pool: ProcessPool) -> None:
    """The zygote froze what it imported (``control_plane.heap``): a full collection in
    a fork skips those objects, so it does not copy the pages they live on."""
    runtime = ProcessRuntime(pool)
    replica = runtime.start(spec("basic:Heap", "r1"), lambda *_: None)
    try:
        [done] = list(replica.call(CallRequest("c1", {})))
    finally:
        replica.stop()
    assert done.kind == "succeeded"
    assert done.output["frozen"] > 100_000  # torch's objects, among others
    # Without the freeze, collecting them copies their pages: 37 MiB with torch alone.
    assert done.output["gained_kib"] < 16 * 1024


def test_preloading_transformers_builds_its_conversion_table_ahead() -> None:
    """PEFT's first wrap of a model would otherwise compile it (~170 ms of user setup)."""
    import transformers.conversion_mapping as mapping

    from worker.replica_child import import_libraries

    mapping._checkpoint_conversion_mapping_cache = None  # as in a fresh process
    import_libraries(("transformers",))
    assert mapping._checkpoint_conversion_mapping_cache is not None


def test_a_cpu_replica_computes_with_the_threads_it_was_given(pool: ProcessPool) -> None:
    runtime = ProcessRuntime(pool)
    for threads in (1, 2):
        given = spec("basic:Threads", f"t{threads}").model_copy(update={"cpu_threads": threads})
        replica = runtime.start(given, lambda *_: None)
        try:
            [done] = list(replica.call(CallRequest("c1", None)))
            assert done.output == {"torch_threads": threads}
        finally:
            replica.stop()


def test_a_replica_has_the_workers_threads_at_most_its_containers_cpus() -> None:
    from control_plane.protocol import ContainerOptions, StartReplica
    from worker.replicas import default_cpu_threads, replica_cpu_cores, replica_cpu_threads

    def start(cpus: float | None) -> StartReplica:
        container = ContainerOptions(image="i:v1", cpus=cpus) if cpus is not None else None
        return StartReplica(
            replica_id="r",
            function="f",
            version=1,
            bundle_digest="blake3:00",
            entry="a:B",
            container=container,
        )

    assert replica_cpu_threads(7, start(None)) == 7
    assert replica_cpu_threads(7, start(2.5)) == 3
    assert replica_cpu_threads(2, start(8.0)) == 2
    assert replica_cpu_threads(7, start(0.5)) == 1
    assert default_cpu_threads() == max(1, (os.cpu_count() or 1) - 1)
    # The cores a heavy LLM step may take: the same cap; none where threads were set.
    assert replica_cpu_cores(8, start(None)) == 8
    assert replica_cpu_cores(8, start(2.5)) == 3
    assert replica_cpu_cores(None, start(2.5)) is None


def test_the_zygotes_imports_leave_cuda_to_its_forks() -> None:
    """transformers and peft imported, the CUDA driver is still uninitialised in the
    zygote (its child could not use CUDA otherwise), so CUDA processes are forks too."""
    from worker.zygote import Zygote, cuda_initialized

    zygote = Zygote(("transformers", "peft"))
    try:
        assert zygote.forks_cuda
    finally:
        zygote.close()
    assert not cuda_initialized()  # nor did this test process's own imports
