"""A worker that heartbeats but whose replicas die under every call (item 15):
after ``THAW_WORKER_FAILURE_THRESHOLD`` such failures in a row (the replica's
fault, final with ``retries = 0``) it gets no new calls or replicas, and once
``THAW_WORKER_PROBE_INTERVAL_S`` has passed it is given a probe replica only
when no closed worker can take one; once a probe passes it serves again. The
decision is ``services.worker_health``; a function's own exceptions do not count
(``test_isolation.py``)."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import E2EStore
from tests.e2e.stack import wait_for
from tests.faults.conftest import FaultStack, chaos_spec, fault_stack, proc_named, sigkill
from tests.faults.harness import Prober, check_ledger, db_rows, db_value

pytestmark = pytest.mark.slow
THRESHOLD = 3
PROBE_INTERVAL_S = 4.0


def _outcomes(stack: FaultStack, worker: str) -> list[str]:
    """Final statuses of the calls run on ``worker``, oldest first."""
    sql = (
        "SELECT c.status FROM calls c JOIN replicas r ON r.id = c.replica_id "
        "JOIN workers w ON w.id = r.worker_id WHERE w.name = :w "
        "AND c.status IN ('succeeded', 'failed') ORDER BY c.finished_at"
    )
    return [str(r[0]) for r in db_rows(stack, sql, w=worker)]


# Async calls go through the queue; synchronous warm ones take the fast path
# (services.direct_calls), whose failures must count and which must honour the
# breaker too.
@pytest.mark.parametrize("sync", [False, True], ids=["queued", "direct"])
def test_failing_worker_gets_no_calls_until_a_probe_passes(
    tmp_path: Path, chaos_store: E2EStore, sync: bool
) -> None:
    broken = tmp_path / "broken"
    broken.write_text("its GPU fell off the bus")
    env = {
        "THAW_WORKER_FAILURE_THRESHOLD": str(THRESHOLD),
        "THAW_WORKER_PROBE_INTERVAL_S": str(PROBE_INTERVAL_S),
    }
    with fault_stack("embedded", tmp_path, chaos_store, workers=0, **env) as stack:
        stack.add_worker(CHAOS_BROKEN_FILE=str(broken))  # w1: heartbeats fine, replicas die
        scaling = {"min_replicas": 1, "max_replicas": 2, "idle_timeout_s": 300}
        stack.deploy(chaos_spec(chaos_store, "fragile", retries=0, scaling=scaling))
        wait_for(lambda: _ready_on(stack, "w1"), "a replica on the broken worker", 60)
        with Prober(stack, "fragile", every_s=0.3, sync=sync) as prober:
            # Alone, w1 gets each new replica until its breaker opens.
            wait_for(lambda: _outcomes(stack, "w1").count("failed") >= THRESHOLD, "failures")
            broken_since = time.monotonic()
            stack.add_worker()  # w2: healthy, takes the replicas from now on
            wait_for(lambda: _outcomes(stack, "w2").count("succeeded") >= 15, "w2 to serve", 90)
            broken.unlink()  # repaired: the next probe passes
            broken_s = time.monotonic() - broken_since
            # With w2 gone, w1 (half-open) gets a probe replica; its first call closes
            # the breaker and w1 takes the calls.
            sigkill(proc_named(stack, "w2"))
            wait_for(lambda: _outcomes(stack, "w1").count("succeeded") >= 4, "w1 back", 60)
        check_ledger(stack, prober.accepted)
        on_w1 = _outcomes(stack, "w1")
        first_success = on_w1.index("succeeded")
        assert set(on_w1[:first_success]) == {"failed"}
        # While broken it got the calls that opened its breaker, then one probe per interval.
        probes_at_most = math.ceil(broken_s / PROBE_INTERVAL_S) + 1
        assert first_success <= THRESHOLD + probes_at_most, (on_w1, broken_s)
        assert _outcomes(stack, "w2").count("succeeded") >= 15
        faults = {f for (f,) in db_rows(stack, _W1_FAULTS, w="w1")}
        assert faults == {"replica"}, faults


_W1_FAULTS = (
    "SELECT c.fault FROM calls c JOIN replicas r ON r.id = c.replica_id "
    "JOIN workers w ON w.id = r.worker_id WHERE w.name = :w AND c.status = 'failed'"
)


def _ready_on(stack: FaultStack, worker: str) -> bool:
    sql = (
        "SELECT count(*) FROM replicas r JOIN workers w ON w.id = r.worker_id "
        "WHERE w.name = :w AND r.state = 'ready'"
    )
    return bool(db_value(stack, sql, w=worker))
