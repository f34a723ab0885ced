"""Replica processes that crash (item 4), start slower than a caller's deadline
(item 8), run past their timeout (item 9), or lose their streaming client
(item 10), on one embedded stack with a real worker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import E2EStore
from tests.e2e.stack import wait_for
from tests.faults.conftest import (
    FaultStack,
    chaos_spec,
    fault_stack,
    invoke,
    invoke_async,
)
from tests.faults.harness import Prober, check_ledger, db_calls, db_value, statuses

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, chaos_store: E2EStore) -> Iterator[FaultStack]:
    tmp = tmp_path_factory.mktemp("replica-faults")
    with fault_stack("embedded", tmp, chaos_store, workers=1) as s:
        yield s


def _final(stack: FaultStack, call_id: str) -> dict[str, Any]:
    done: dict[str, Any] = wait_for(
        lambda: (
            (c := stack.call(call_id))["status"] not in ("queued", "dispatched", "running") and c
        ),
        f"call {call_id} to end",
        90,
    )
    return done


def _replica_pids(pids: Path) -> dict[str, int]:
    return {p.name: int(p.read_text()) for p in pids.iterdir()}


@pytest.mark.parametrize(
    ("crash", "exit_code"), [("segfault", "-11"), ("abort", "-6"), ("oom", "-9")]
)
def test_crashing_function_fails_with_reason_and_others_run(
    stack: FaultStack, chaos_store: E2EStore, tmp_path: Path, crash: str, exit_code: str
) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    name = f"crash-{crash}"
    stack.deploy(chaos_spec(chaos_store, name, retries=2, env={"RUNS_DIR": str(runs)}))
    stack.deploy(chaos_spec(chaos_store, "bystander"))
    with Prober(stack, "bystander", every_s=0.3) as prober:
        crashes = [invoke_async(stack, name, {"crash": crash}) for _ in range(2)]
        ended = [_final(stack, c) for c in crashes]
    calls = check_ledger(stack, prober.accepted + crashes, runs_dir=runs, counted=crashes)
    for c in ended:
        assert c["status"] == "failed", c
        assert f"exited with code {exit_code}" in c["error"], c
    assert statuses(calls, prober.accepted) == {"succeeded": len(prober.accepted)}
    # Bounded: no call ran more than retries + 1 times, and no replica restart loop.
    started = [c for c in db_calls(stack).values() if c.function == name]
    assert len(started) == 2
    assert _replica_count(stack, name) <= 2 * 3


def _replica_count(stack: FaultStack, function: str) -> int:
    return int(db_value(stack, "SELECT count(*) FROM replicas WHERE function = :f", f=function))


def test_cold_start_past_deadline_is_504_and_replica_still_starts(
    stack: FaultStack, chaos_store: E2EStore
) -> None:
    spec = chaos_spec(chaos_store, "slow-start", env={"SETUP_SLEEP_S": "6"})
    stack.deploy(spec)
    r = invoke(stack, "slow-start", {"input": 1}, **{"X-Thaw-Deadline-Ms": "1500"})
    assert r.status_code == 504, r.text
    body = r.json()
    assert "schedule" in body["phases_ms"], body
    assert "did not finish within its deadline" in body["detail"]
    assert stack.call(body["call_id"])["status"] == "expired"
    # The replica keeps starting; once ready, the next call is warm.
    wait_for(lambda: _ready_replicas(stack, "slow-start"), "the slow replica to be ready", 60)
    warm = invoke(stack, "slow-start", {"input": 2})
    assert warm.status_code == 200, warm.text
    assert warm.headers["X-Thaw-Cold"] == "false"
    check_ledger(stack, [body["call_id"], warm.headers["X-Thaw-Call-Id"]])


def test_calls_failed_by_a_failing_cold_start_are_cold(
    stack: FaultStack, chaos_store: E2EStore
) -> None:
    spec = chaos_spec(chaos_store, "bad-setup", env={"SETUP_FAIL": "on purpose"})
    stack.deploy(spec)
    call_ids = [invoke_async(stack, "bad-setup", {"i": i}) for i in range(2)]
    for call_id in call_ids:
        done = _final(stack, call_id)
        assert done["status"] == "failed", done
        assert "setup failed: on purpose" in done["error"], done
        # They waited for that start: cold, with its phases as far as it got.
        assert done["cold"] is True, done
        assert "schedule" in done["phases_ms"], done
    check_ledger(stack, call_ids)


def _ready_replicas(stack: FaultStack, function: str) -> int:
    sql = "SELECT count(*) FROM replicas WHERE function = :f AND state = 'ready'"
    return int(db_value(stack, sql, f=function))


def _replica_state(stack: FaultStack, replica_id: str) -> str:
    return str(db_value(stack, "SELECT state FROM replicas WHERE id = :id", id=replica_id))


def test_call_past_timeout_is_cancelled_and_its_process_serves_on(
    stack: FaultStack, chaos_store: E2EStore, tmp_path: Path
) -> None:
    pids = tmp_path / "pids"
    pids.mkdir()
    scaling = {"min_replicas": 1, "max_replicas": 1, "idle_timeout_s": 120}
    env = {"PID_DIR": str(pids)}
    stack.deploy(chaos_spec(chaos_store, "too-slow", timeout_s=3, scaling=scaling, env=env))
    wait_for(lambda: _ready_replicas(stack, "too-slow"), "the first replica", 60)
    [(first_replica, pid)] = _replica_pids(pids).items()  # max_replicas 1: the one that runs it
    call_id = invoke_async(stack, "too-slow", {"spin_s": 30})
    done = _final(stack, call_id)
    # Ended by the worker's timeout, or by the control plane's deadline when that comes first.
    assert done["status"] == "timeout", done
    # Cancelled in its replica (a process that still answers is never killed): the
    # same process serves the next call, and no replacement was started.
    after = invoke(stack, "too-slow", {"input": {"quick": True}})
    assert after.status_code == 200, after.text
    assert after.json()["output"]["pid"] == pid and Path(f"/proc/{pid}").exists()
    assert list(_replica_pids(pids)) == [first_replica]
    check_ledger(stack, [call_id, after.headers["X-Thaw-Call-Id"]])


@pytest.mark.parametrize("policy", ["cancel", "finish"])
def test_client_gone_mid_stream(
    stack: FaultStack, chaos_store: E2EStore, tmp_path: Path, policy: str
) -> None:
    name = f"stream-{policy}"
    stack.deploy(chaos_spec(chaos_store, name, on_disconnect=policy))
    first = invoke(stack, name, {"input": {"warm": True}})
    assert first.status_code == 200, first.text
    replica_pid = first.json()["output"]["pid"]
    headers = {"Accept": "text/event-stream", "Authorization": f"Bearer {stack.admin_key}"}
    body = {"input": {"stream": 40, "every_s": 0.25}}
    url = f"/v1/functions/{name}/invoke"
    with (
        httpx.Client(base_url=stack.url, timeout=30) as c,
        c.stream("POST", url, json=body, headers=headers) as r,
    ):
        call_id = r.headers["X-Thaw-Call-Id"]
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("event:")) == "event: output"
    # leaving the block closed the connection mid-stream
    done = _final(stack, call_id)
    assert done["status"] == ("cancelled" if policy == "cancel" else "succeeded"), done
    again = invoke(stack, name, {"input": {"after": True}})  # the replica still serves
    assert again.status_code == 200, again.text
    assert again.json()["output"]["pid"] == replica_pid
    check_ledger(stack, [call_id, again.headers["X-Thaw-Call-Id"]])
