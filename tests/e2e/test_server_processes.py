"""``thaw server`` with two processes behind one port: a caller held by one process is
woken by a result the other recorded, and ``/metrics`` counts the calls of both.

The kernel picks the process that takes a connection; these tests pick it by
stopping the other process (SIGSTOP) while the connection is made and its
request read, and only then (longer, it could hold the database's writer lock,
and uvicorn kills a process that does not answer its health check for 5 s).
The result poll is a minute long, so only a wake-up from the other process
ends a wait in time; a verified key is trusted for ten minutes, so only a
revocation sent by the other process ends that in time.
"""

from __future__ import annotations

import os
import re
import signal
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.e2e.conftest import E2EStore, running_stack
from tests.e2e.stack import Stack, wait_for
from tests.e2e.test_platform import invoke, probe_spec

POLL_S = 60.0
# Long enough for the process left running to take the connection and read the request.
HANDOVER_S = 0.5
# A process trusts a key it verified this long: only a revocation sent to it ends that.
AUTH_CACHE_TTL_S = 600


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, e2e_store: E2EStore) -> Iterator[Stack]:
    settings = {
        "THAW_SERVER_PROCESSES": "2",
        "THAW_RESULT_POLL_INTERVAL_S": str(POLL_S),
        "THAW_AUTH_CACHE_TTL_S": str(AUTH_CACHE_TTL_S),
    }
    tmp = tmp_path_factory.mktemp("e2e-processes")
    with running_stack("embedded", tmp, e2e_store, settings=settings) as s:
        scaling = {"min_replicas": 1, "max_replicas": 1, "idle_timeout_s": 600}
        s.deploy(probe_spec(e2e_store, "probe", scaling=scaling))
        wait_for(lambda: len(serving(s)) == 2, "both server processes")
        yield s


def serving(stack: Stack) -> list[int]:
    """The server's processes that serve: its children with a peer metrics socket
    (bound once the app has started)."""
    server = stack.procs[0].popen.pid
    children = Path(f"/proc/{server}/task/{server}/children").read_text().split()
    bound = re.findall(r"/thaw-peers-[^/\s]+/(\d+)\.metrics", Path("/proc/net/unix").read_text())
    return sorted(int(pid) for pid in set(bound) if pid in children)


@contextmanager
def stopped(pid: int) -> Iterator[None]:
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def invoke_through(stack: Stack, other: int, **headers: str) -> int:
    """The status of a probe invoke taken by the process that is not ``other``.

    ``other`` is stopped only while the connection is taken: a process stopped for
    longer may hold the database's writer lock, and is killed by uvicorn after 5 s."""
    with ThreadPoolExecutor(1) as pool, stopped(other):
        answer = pool.submit(invoke, stack, "probe", {"input": {}}, **headers)
        time.sleep(HANDOVER_S)
    return int(answer.result(timeout=120).status_code)


def test_a_result_recorded_by_one_process_wakes_a_caller_held_by_the_other(
    stack: Stack,
) -> None:
    assert invoke(stack, "probe", {"input": {}}).status_code == 200  # the replica is up
    a, b = serving(stack)
    key = {"Idempotency-Key": uuid.uuid4().hex}
    body = {"input": {"sleep_s": 2}}
    with ThreadPoolExecutor(2) as pool:
        with stopped(b):  # A takes the call and runs it (warm: on its own connection)
            first = pool.submit(invoke, stack, "probe", body, **key)
            time.sleep(HANDOVER_S)
        with stopped(a):  # B takes the same call again: it waits for A's result
            asked_at = time.monotonic()
            again = pool.submit(invoke, stack, "probe", body, **key)
            time.sleep(HANDOVER_S)
        r1, r2 = first.result(timeout=120), again.result(timeout=120)
        waited_s = time.monotonic() - asked_at
    assert r1.status_code == r2.status_code == 200, (r1.text, r2.text)
    assert r1.headers["X-Thaw-Call-Id"] == r2.headers["X-Thaw-Call-Id"]
    assert r1.json()["output"] == r2.json()["output"]
    assert waited_s < POLL_S / 2, f"B saw the result after {waited_s:.1f} s: polled, not woken"


def calls_counted(stack: Stack) -> float:
    with stack.client() as c:
        text = c.get("/metrics").text
    prefix = 'thaw_call_latency_seconds_count{cold="false",function="probe",status="succeeded"} '
    return sum(float(line[len(prefix) :]) for line in text.splitlines() if line.startswith(prefix))


def test_metrics_count_the_calls_of_both_processes(stack: Stack) -> None:
    assert invoke(stack, "probe", {"input": {}}).status_code == 200  # the replica is up
    a, b = serving(stack)
    before = calls_counted(stack)
    for other in (b, b, b, a, a):  # 3 taken (and recorded) by A, 2 by B, one at a time
        assert invoke_through(stack, other) == 200
    assert calls_counted(stack) == before + 5  # whichever process answers the scrape


def test_the_processes_charge_one_rate_limit(stack: Stack) -> None:
    """A key's burst spent through one process is spent for the other too: the
    kernel spreads connections, so buckets of their own would give N times the limit."""
    assert invoke(stack, "probe", {"input": {}}).status_code == 200  # the replica is up
    with stack.client() as c:
        r = c.post("/v1/keys", json={"scopes": ["invoke"], "rate_per_s": 0.01, "rate_burst": 2})
    assert r.status_code == 201, r.text
    auth = {"Authorization": f"Bearer {r.json()['token']}"}
    a, b = serving(stack)
    # The burst through A, then one more through B.
    assert [invoke_through(stack, other, **auth) for other in (b, b, a)] == [200, 200, 429]


def revoke(stack: Stack, key_id: str) -> int:
    with stack.client() as c:
        return int(c.delete(f"/v1/keys/{key_id}").status_code)


def test_a_key_revoked_through_one_process_is_refused_by_the_other(stack: Stack) -> None:
    assert invoke(stack, "probe", {"input": {}}).status_code == 200  # the replica is up
    with stack.client() as c:
        r = c.post("/v1/keys", json={"scopes": ["invoke"]})
    assert r.status_code == 201, r.text
    key_id, auth = r.json()["id"], {"Authorization": f"Bearer {r.json()['token']}"}
    a, b = serving(stack)
    assert invoke_through(stack, a, **auth) == 200  # B verified the key: it trusts it now
    with ThreadPoolExecutor(1) as pool, stopped(b):  # revoked through A
        revoked = pool.submit(revoke, stack, key_id)
        time.sleep(HANDOVER_S)
    assert revoked.result(timeout=120) == 200
    deadline = time.monotonic() + 30  # far within B's trust of it
    while (code := invoke_through(stack, a, **auth)) == 200:
        assert time.monotonic() < deadline, "B still serves a key revoked through A"
    assert code == 401
