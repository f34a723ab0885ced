"""The whole path on real processes: deploy, cold and warm invoke, stream, async with
idempotency, failure, timeout, scale to zero and scale up under load.

Embedded (SQLite + filesystem broker) runs by default; PostgreSQL + Redis is
marked slow. RabbitMQ runs the core subset in ``test_rabbitmq.py``.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import E2EStore, running_stack
from tests.e2e.stack import Stack, wait_for

COLD_PHASES = {
    "schedule",
    "process_start",
    "imports",
    "device_init",
    "weights_fetch",
    "weights_to_device",
    "adapters",
    "user_setup",
}


@pytest.fixture(
    scope="module",
    params=["embedded", pytest.param("postgres-redis", marks=pytest.mark.slow)],
)
def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, e2e_store: E2EStore
) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp(f"e2e-{request.param}")
    with running_stack(request.param, tmp, e2e_store) as s:
        yield s


def probe_spec(store: E2EStore, name: str, **kw: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": name,
        "bundle": store.bundle,
        "entry": "app:Probe",
        "model": store.model,
        "adapters": [{"name": "a0", "ref": store.adapter}],
        "device": "cpu",
        "timeout_s": 120,
        "scaling": {"min_replicas": 0, "max_replicas": 2, "idle_timeout_s": 120},
    }
    spec.update(kw)
    return spec


def invoke(stack: Stack, name: str, body: dict[str, Any], **headers: str) -> Any:
    with stack.client() as c:
        return c.post(f"/v1/functions/{name}/invoke", json=body, headers=headers)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is gone for our purposes.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ")[-1][:1] != "Z"


# --- the core path (also run on RabbitMQ) ------------------------------------------
def check_cold_then_warm(stack: Stack, store: E2EStore) -> None:
    stack.deploy(probe_spec(store, "probe"))
    cold = invoke(stack, "probe", {"input": {"x": 1}, "adapter": "a0"})
    assert cold.status_code == 200, f"{cold.text}\n{stack.logs()}"
    body = cold.json()
    assert cold.headers["X-Thaw-Cold"] == "true" and body["cold"] is True
    assert set(body["phases_ms"]) >= COLD_PHASES, body["phases_ms"]
    out = body["output"]
    assert out["input"] == {"x": 1} and out["adapter"] == "a0" and out["adapters"] == ["a0"]
    assert out["tensors"] > 0 and out["hidden"] == 64
    # The cold call waited for its replica, then ran over the worker's direct port
    # (services.direct_runner), not through the broker.
    assert direct_calls(stack, "probe", "ran") == 1, stack.logs()
    warm = invoke(stack, "probe", {"input": {"x": 2}})
    assert warm.status_code == 200, warm.text
    assert warm.headers["X-Thaw-Cold"] == "false"
    assert warm.json()["output"]["pid"] == out["pid"]  # the same replica process
    timings = warm.json()["timings_ms"]
    assert timings["queue_wait"] >= 0 and timings["total"] >= timings["execution"] > 0
    # The warm call found a ready replica with room: it ran over the worker's direct
    # port, not through the broker (services.direct_calls).
    assert direct_calls(stack, "probe", "ran") == 2, stack.logs()


def direct_calls(stack: Stack, function: str, outcome: str) -> float:
    with stack.client() as c:
        text = c.get("/metrics").text
    prefix = f'thaw_direct_calls_total{{function="{function}",outcome="{outcome}"}} '
    values = [float(line[len(prefix) :]) for line in text.splitlines() if line.startswith(prefix)]
    return values[0] if values else 0.0


def check_stream(stack: Stack, store: E2EStore) -> None:
    stack.deploy({"name": "count", "bundle": store.bundle, "entry": "app:Count", "device": "cpu"})
    with (
        stack.client() as c,
        c.stream(
            "POST",
            "/v1/functions/count/invoke",
            json={"input": {"n": 3}},
            headers={"Accept": "text/event-stream"},
        ) as s,
    ):
        text = "".join(s.iter_text())
    events = [block.split("\n") for block in text.strip().split("\n\n")]
    kinds = [e[0].removeprefix("event: ") for e in events]
    assert kinds == ["output", "output", "output", "done"], text
    assert [json.loads(e[1].removeprefix("data: ")) for e in events[:3]] == [
        {"i": 0},
        {"i": 1},
        {"i": 2},
    ]
    # A caller that does not stream gets the chunks as a list.
    whole = invoke(stack, "count", {"input": {"n": 2}})
    assert whole.json()["output"] == [{"i": 0}, {"i": 1}]


def check_async_idempotency(stack: Stack) -> None:
    key = uuid.uuid4().hex
    headers = {"Prefer": "respond-async", "Idempotency-Key": key}
    first = invoke(stack, "probe", {"input": {"x": 5}}, **headers)
    again = invoke(stack, "probe", {"input": {"x": 5}}, **headers)
    assert first.status_code == again.status_code == 202, first.text
    call_id = first.json()["call_id"]
    assert again.json()["call_id"] == call_id
    done = wait_for(
        lambda: (c := stack.call(call_id))["status"] == "succeeded" and c, "the async call", 60
    )
    assert done["output"]["input"] == {"x": 5}
    other = invoke(stack, "probe", {"input": {"x": 6}}, **headers)
    assert other.status_code == 409, other.text  # same key, different input


def test_deploy_cold_warm_stream_async(stack: Stack, e2e_store: E2EStore) -> None:
    check_cold_then_warm(stack, e2e_store)
    check_stream(stack, e2e_store)
    check_async_idempotency(stack)


# --- failures ----------------------------------------------------------------------
def test_failure_is_reported_and_the_replica_stays(stack: Stack, e2e_store: E2EStore) -> None:
    stack.deploy(probe_spec(e2e_store, "probe-fail"))
    ok = invoke(stack, "probe-fail", {"input": {}})
    assert ok.status_code == 200, ok.text
    failed = invoke(stack, "probe-fail", {"input": {"raise": "on purpose"}})
    assert failed.status_code == 500, failed.text
    body = failed.json()
    assert body["status"] == "failed"
    assert body["error"].startswith("RuntimeError: boom: on purpose")
    assert "app.py" in body["error"]  # the traceback's tail
    after = invoke(stack, "probe-fail", {"input": {}})
    assert after.status_code == 200 and after.headers["X-Thaw-Cold"] == "false"
    assert after.json()["output"]["pid"] == ok.json()["output"]["pid"]


def test_an_llm_calls_tokens_are_in_its_record(stack: Stack, e2e_store: E2EStore) -> None:
    """A function's ``call.usage`` reaches the call record through its replica and
    worker, for a sync call and an async one, a failed call's too; a malformed count
    is dropped."""
    spec = {"name": "tokens", "bundle": e2e_store.bundle, "entry": "app:Tokens", "device": "cpu"}
    stack.deploy(spec)
    ok = invoke(stack, "tokens", {"input": {"prompt": "one two three"}})
    assert ok.status_code == 200, f"{ok.text}\n{stack.logs()}"
    three = {"prompt_tokens": 3, "completion_tokens": 3}
    assert ok.json()["usage"] == three
    assert stack.call(ok.json()["call_id"])["usage"] == three
    failed = invoke(stack, "tokens", {"input": {"prompt": "one two", "raise": True}})
    assert failed.status_code == 500, failed.text
    assert stack.call(failed.json()["call_id"])["usage"] == {
        "prompt_tokens": 2,
        "completion_tokens": 2,
    }
    malformed = invoke(stack, "tokens", {"input": {"prompt": "one", "bad": -1}})
    assert malformed.status_code == 200 and malformed.json()["usage"] is None
    queued = invoke(stack, "tokens", {"input": {"prompt": "a b c d"}}, Prefer="respond-async")
    assert queued.status_code == 202, queued.text
    call_id = queued.json()["call_id"]
    done = wait_for(
        lambda: (c := stack.call(call_id))["status"] == "succeeded" and c, "the async call", 60
    )
    assert done["usage"] == {"prompt_tokens": 4, "completion_tokens": 4}


def test_timeout_ends_that_call_and_the_replica_serves_on(
    stack: Stack, e2e_store: E2EStore, tmp_path: Path
) -> None:
    spec = probe_spec(
        e2e_store,
        "probe-timeout",
        timeout_s=4,
        env={"PID_DIR": str(tmp_path)},
        scaling={"min_replicas": 1, "max_replicas": 1, "idle_timeout_s": 120},
    )
    stack.deploy(spec)
    first_pid = int(wait_for(lambda: _one_pid(tmp_path), "the warm replica's pid file"))
    # Asleep 1.5 s past its 4 s deadline: the next call, also given 4 s, waits for the
    # slot about 1.5 s, whatever the dispatch costs on this backend.
    slow = invoke(stack, "probe-timeout", {"input": {"sleep_s": 5.5}})
    assert slow.status_code == 504, slow.text
    assert stack.call(slow.json()["call_id"])["status"] == "timeout"
    # Cancelled in its replica, which is not killed: the next call is served there
    # (once the cancelled call's sleep, native code, returns and frees its slot).
    after = invoke(stack, "probe-timeout", {"input": {}})
    assert after.status_code == 200, f"{after.text}\n{stack.logs()}"
    assert after.json()["output"]["pid"] == first_pid and pid_alive(first_pid)
    assert len(list(tmp_path.iterdir())) == 1  # no replacement was started


def _one_pid(directory: Path) -> str | None:
    files = list(directory.iterdir())
    return files[0].read_text() if files else None


# --- scaling -----------------------------------------------------------------------
def test_scale_to_zero_after_idle(stack: Stack, e2e_store: E2EStore) -> None:
    scaling = {"min_replicas": 0, "max_replicas": 1, "idle_timeout_s": 1}
    stack.deploy(probe_spec(e2e_store, "probe-idle", scaling=scaling))
    first = invoke(stack, "probe-idle", {"input": {}})
    assert first.status_code == 200, first.text
    pid = first.json()["output"]["pid"]
    wait_for(lambda: not pid_alive(pid), "the idle replica to stop", 60)
    wait_for(lambda: not _replicas_of(stack, first.json()["output"]["replica"]), "no replica", 30)
    again = invoke(stack, "probe-idle", {"input": {}})
    assert again.status_code == 200 and again.headers["X-Thaw-Cold"] == "true"


def _replicas_of(stack: Stack, replica_id: str) -> list[Any]:
    return [
        r
        for w in stack.workers()
        for r in w["replicas"]
        if r["id"] == replica_id and r["state"] not in ("stopped", "failed")
    ]


def test_scale_up_under_load(stack: Stack, e2e_store: E2EStore) -> None:
    scaling = {"min_replicas": 0, "max_replicas": 2, "idle_timeout_s": 120, "target_concurrency": 1}
    stack.deploy(probe_spec(e2e_store, "probe-load", scaling=scaling))
    # Six 3 s calls keep one replica busy for 18 s, longer than a second replica
    # takes to start even on a loaded machine (a fresh process imports torch,
    # transformers and peft), so the second one is sure to serve some of them.
    with ThreadPoolExecutor(6) as pool:
        results = list(
            pool.map(
                lambda i: invoke(stack, "probe-load", {"input": {"i": i, "sleep_s": 3}}), range(6)
            )
        )
    assert all(r.status_code == 200 for r in results), [r.text for r in results]
    replicas = {r.json()["output"]["replica"] for r in results}
    assert len(replicas) == 2, replicas
