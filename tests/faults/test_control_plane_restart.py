"""The control plane SIGKILLed and restarted with calls queued, running and
streaming (item 7): state comes back from the database, results of calls that
ran meanwhile are recorded, and clients fetch them by call id."""

from __future__ import annotations

from pathlib import Path

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
    proc_named,
    sigkill,
)
from tests.faults.harness import check_ledger, statuses

pytestmark = pytest.mark.slow


def test_restart_with_calls_queued_running_and_streaming(
    tmp_path: Path, chaos_store: E2EStore
) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    with fault_stack("embedded", tmp_path, chaos_store, workers=1) as stack:
        one = {"min_replicas": 1, "max_replicas": 1, "idle_timeout_s": 120}
        env = {"RUNS_DIR": str(runs)}
        stack.deploy(chaos_spec(chaos_store, "busy", retries=0, scaling=one, env=env))
        stack.deploy(
            chaos_spec(
                chaos_store, "streamer", retries=0, scaling=one, env=env, on_disconnect="finish"
            )
        )
        for name in ("busy", "streamer"):  # warm, so the calls below run at once
            assert invoke(stack, name, {"input": "warm"}).status_code == 200
        running = invoke_async(stack, "busy", {"sleep_s": 6})
        queued = [invoke_async(stack, "busy", {"i": i}) for i in range(3)]
        stream = _start_stream(stack)
        streaming = stream.headers["X-Thaw-Call-Id"]
        wait_for(lambda: stack.call(running)["status"] == "running", "the long call to run")
        assert all(stack.call(q)["status"] in ("queued", "dispatched") for q in queued)

        sigkill(proc_named(stack, "server"))
        stack.start_server()  # same database, a fresh process
        stream.close()  # its server is gone; the client fetches the result by call id

        ids = [running, *queued, streaming]
        calls = check_ledger(stack, ids, runs_dir=runs, settle_s=120)
        assert statuses(calls, ids) == {"succeeded": len(ids)}, [calls[i] for i in ids]
        assert stack.call(running)["output"]["input"] == {"sleep_s": 6}
        assert [stack.call(q)["output"]["input"] for q in queued] == [{"i": i} for i in range(3)]
        assert all(calls[i].attempt == 1 for i in ids)  # each ran once, not again


def _start_stream(stack: FaultStack) -> httpx.Response:
    """Start a streaming call and leave it streaming (the open response)."""
    headers = {"Accept": "text/event-stream", "Authorization": f"Bearer {stack.admin_key}"}
    body = {"input": {"stream": 20, "every_s": 0.3}}
    client = httpx.Client(base_url=stack.url, timeout=30)
    response = client.send(
        client.build_request("POST", "/v1/functions/streamer/invoke", json=body, headers=headers),
        stream=True,
    )
    next(line for line in response.iter_lines() if line.startswith("event: output"))
    return response
