"""Workers SIGKILLed under load (items 1, 2) and a forced redelivery of a call sent
twice with one Idempotency-Key (item 3), on one embedded stack with real workers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from control_plane.dispatch.celery_app import make_celery
from control_plane.dispatch.celery_dispatcher import CeleryDispatcher
from control_plane.protocol import RunCall
from tests.e2e.conftest import E2EStore
from tests.e2e.stack import wait_for
from tests.faults.conftest import (
    FaultStack,
    chaos_spec,
    fault_stack,
    invoke,
    invoke_async,
    proc_named,
    sigkill,
    worker_name_of_call,
)
from tests.faults.harness import Prober, check_ledger, db_calls, db_rows, statuses

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, chaos_store: E2EStore) -> Iterator[FaultStack]:
    tmp = tmp_path_factory.mktemp("worker-faults")
    with fault_stack("embedded", tmp, chaos_store, workers=2) as s:
        yield s


def _status(stack: FaultStack, call_id: str) -> dict[str, Any]:
    return stack.call(call_id)


def _running(stack: FaultStack, call_id: str, attempt: int) -> bool:
    c = _status(stack, call_id)
    return c["status"] == "running" and c["attempt"] == attempt


def _scaling(**kw: Any) -> dict[str, Any]:
    return {"min_replicas": 0, "max_replicas": 2, "idle_timeout_s": 120, **kw}


def test_sigkill_mid_call_retries_elsewhere_then_fails_when_spent(
    stack: FaultStack, chaos_store: E2EStore, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    spec = chaos_spec(chaos_store, "kill-mid-call", retries=1, env={"RUNS_DIR": str(runs)})
    stack.deploy(spec)
    stack.add_worker()  # three workers: after two are killed, one still serves the prober
    with Prober(stack, "kill-mid-call", every_s=0.3) as prober:
        long_id = invoke_async(stack, "kill-mid-call", {"sleep_s": 8})
        wait_for(lambda: _running(stack, long_id, 1), "the long call to run", 60)
        first = worker_name_of_call(stack, long_id)
        sigkill(proc_named(stack, first))
        # Retried on the surviving worker as attempt 2; kill that one too: retries spent.
        wait_for(lambda: _running(stack, long_id, 2), "the retry to run", 60)
        second = worker_name_of_call(stack, long_id)
        assert second != first
        sigkill(proc_named(stack, second))
        ended = wait_for(lambda: (c := _status(stack, long_id))["status"] != "running" and c, "end")
        assert not (runs / long_id).read_text().count("\n") > 2
    calls = check_ledger(stack, prober.accepted, runs_dir=runs)
    assert ended["status"] == "failed" and ended["attempt"] == 2, ended
    assert "stopped heartbeating" in ended["error"]
    assert len((runs / long_id).read_text().splitlines()) == 2  # one run per attempt
    assert len(prober.accepted) > 10 and not prober.refused
    assert statuses(calls, prober.accepted)["succeeded"] >= len(prober.accepted) - 4


def test_sigkill_worker_holding_prefetched_calls(
    stack: FaultStack, chaos_store: E2EStore, tmp_path: Path
) -> None:
    # A worker with 2 consumer threads: the calls beyond wait in its queue or prefetch.
    holder = stack.add_worker(THAW_WORKER_CONCURRENCY="2")
    spec = chaos_spec(
        chaos_store, "prefetch", retries=1, scaling=_scaling(max_replicas=1, target_concurrency=16)
    )
    stack.deploy(spec)
    warm = invoke(stack, "prefetch", {"input": {"warm": True}})
    assert warm.status_code == 200, warm.text
    held_by = worker_name_of_call(stack, warm.headers["X-Thaw-Call-Id"])
    ids = [invoke_async(stack, "prefetch", {"sleep_s": 2, "i": i}) for i in range(8)]
    wait_for(
        lambda: all(_status(stack, i)["status"] in ("dispatched", "running") for i in ids),
        "every call to be sent to the one replica",
        60,
    )
    if held_by == holder.name:
        live = [p.name for p in stack.procs if p.popen.poll() is None and p.name != "server"]
        assert len(live) > 1, "no other worker to take the calls"
    sigkill(proc_named(stack, held_by))
    calls = check_ledger(stack, ids, settle_s=120)
    assert statuses(calls, ids) == {"succeeded": len(ids)}, [calls[i] for i in ids]
    assert all(calls[i].attempt == 2 for i in ids)
    assert all(worker_name_of_call(stack, i) != held_by for i in ids)


def test_idempotent_call_redelivered_runs_once(
    stack: FaultStack, chaos_store: E2EStore, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    stack.deploy(chaos_spec(chaos_store, "idem", env={"RUNS_DIR": str(runs)}))
    key = {"Idempotency-Key": "order-42"}
    call_id = invoke_async(stack, "idem", {"sleep_s": 2}, **key)
    wait_for(lambda: _running(stack, call_id, 1), "the call to run", 60)
    _redeliver(stack, call_id)  # the broker hands the same message over again
    again = invoke(stack, "idem", {"input": {"sleep_s": 2}}, **key)  # synchronous: waits
    assert again.status_code == 200, again.text
    assert again.json()["call_id"] == call_id
    # A later call on the same replica finished: the duplicate was consumed by then.
    assert invoke(stack, "idem", {"input": {"after": True}}).status_code == 200
    check_ledger(stack, [call_id], runs_dir=runs)
    assert len((runs / call_id).read_text().splitlines()) == 1
    third = invoke(stack, "idem", {"input": {"sleep_s": 2}}, **key)
    assert third.json()["output"] == again.json()["output"]


def _redeliver(stack: FaultStack, call_id: str) -> None:
    """Send the call's RunCall to its worker's queue a second time, as a broker would."""
    [row] = db_rows(
        stack,
        "SELECT c.replica_id, r.worker_id, c.attempt, c.input_json, c.accepted_at, "
        "c.timeout_s FROM calls c JOIN replicas r ON r.id = c.replica_id WHERE c.id = :id",
        id=call_id,
    )
    replica_id, worker_id, attempt, input_json, accepted_at, timeout_s = row
    import json

    msg = RunCall(
        call_id=call_id,
        attempt=attempt,
        replica_id=replica_id,
        function="idem",
        input=json.loads(input_json),
        timeout_s=timeout_s,
        accepted_at=accepted_at,
    )
    app = make_celery("filesystem://", stack.root / "home" / "broker")
    try:
        CeleryDispatcher(app).run_call(worker_id, msg)
    finally:
        app.close()
    assert db_calls(stack)[call_id].status == "running"
