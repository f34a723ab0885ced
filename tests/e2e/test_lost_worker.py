"""A worker agent SIGKILLed mid-call: its replica does not outlive it, the control plane
marks the worker lost, and the call is retried on another worker."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.e2e.conftest import E2EStore, running_stack
from tests.e2e.stack import wait_for
from tests.e2e.test_platform import invoke, pid_alive, probe_spec

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("backend", ["embedded", "postgres-redis"])
def test_lost_worker_call_is_retried_elsewhere(
    backend: str, tmp_path: Path, e2e_store: E2EStore
) -> None:
    pids = tmp_path / "pids"
    pids.mkdir()
    with running_stack(backend, tmp_path, e2e_store) as stack:
        spec = probe_spec(e2e_store, "probe-lost", retries=1, env={"PID_DIR": str(pids)})
        stack.deploy(spec)
        accepted = invoke(stack, "probe-lost", {"input": {"sleep_s": 5}}, Prefer="respond-async")
        call_id = accepted.json()["call_id"]
        wait_for(lambda: stack.call(call_id)["status"] == "running", "the call to run", 60)
        [pid_file] = list(pids.iterdir())
        replica_pid = int(pid_file.read_text())

        [victim] = [p for p in stack.procs if p.name == "w1"]
        victim.popen.send_signal(signal.SIGKILL)
        victim.popen.wait()
        # The replica's socket to its agent closed: it exits rather than linger.
        wait_for(lambda: not pid_alive(replica_pid), "the orphaned replica to exit", 15)

        stack.start_worker("w2")
        done = wait_for(
            lambda: (c := stack.call(call_id))["status"] in ("succeeded", "failed") and c,
            "the retried call",
            90,
        )
        assert done["status"] == "succeeded", f"{done}\n{stack.logs()}"
        assert done["attempt"] == 2
        assert done["output"]["pid"] != replica_pid
        assert any(w["lost"] for w in stack.workers())
