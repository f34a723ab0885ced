"""ReplicaManager as a state machine (Hypothesis): whatever the order of starts, stops,
deaths and (re)deliveries, every fresh (call, attempt) ends in exactly one final event,
and every replica's reported states follow starting → ready → stopped | failed.

The runtime here is an in-process implementation of the ``Runtime`` interface
(the real process runtime is tested in ``test_process_runtime``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from control_plane.protocol import FINAL_CALL_EVENTS, RunCall, StartReplica, StopReplica
from tests.worker.recorder import Recorder
from worker.child_protocol import ReplicaSpec
from worker.replicas import ReplicaManager
from worker.runtimes.base import CallRequest, CallUpdate, OnExit, ReplicaHandle, Runtime

REPLICAS = st.sampled_from(["r1", "r2"])
CALLS = st.sampled_from(["c1", "c2", "c3"])
BUNDLE = "blake3:" + "0" * 64
ALLOWED_NEXT = {
    None: {"starting"},
    "starting": {"ready", "failed", "stopped"},
    "ready": {"stopped", "failed"},
}


class InProcessReplica(ReplicaHandle):
    def __init__(self, replica_id: str, on_exit: OnExit) -> None:
        self.replica_id = replica_id
        self.phases_ms = {"user_setup": 1.0}
        self._on_exit = on_exit
        self._alive = True

    def call(self, request: CallRequest) -> Iterator[CallUpdate]:
        if not self._alive:
            yield CallUpdate("failed", error="not running")
            return
        if request.input == "raise":
            yield CallUpdate("failed", error="ValueError: asked")
            return
        yield CallUpdate("output", output=1)
        yield CallUpdate("succeeded", output=request.input)

    def stop(self, grace_s: float = 5.0) -> None:
        self._alive = False

    def kill(self, reason: str) -> None:
        if self._alive:
            self._alive = False
            self._on_exit(self.replica_id, reason)

    @property
    def alive(self) -> bool:
        return self._alive

    @property
    def outstanding_calls(self) -> int:
        return 0


class InProcessRuntime(Runtime):
    def __init__(self) -> None:
        self.handles: dict[str, InProcessReplica] = {}

    def start(self, spec: ReplicaSpec, on_exit: OnExit) -> ReplicaHandle:
        handle = InProcessReplica(spec.replica_id, on_exit)
        self.handles[spec.replica_id] = handle
        return handle

    def close(self) -> None:
        return None


class ManagerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.recorder = Recorder()
        self.runtime = InProcessRuntime()
        self.manager = ReplicaManager(self.runtime, self.recorder.client(), None)
        self.fresh: set[tuple[str, int]] = set()

    @rule(replica=REPLICAS)
    def start(self, replica: str) -> None:
        msg = StartReplica(
            replica_id=replica, function="f", version=1, bundle_digest=BUNDLE, entry="m:C"
        )
        self.manager.start_replica(msg)

    @rule(replica=REPLICAS)
    def stop(self, replica: str) -> None:
        self.manager.stop_replica(StopReplica(replica_id=replica, reason="test"))

    @rule(replica=REPLICAS)
    def die(self, replica: str) -> None:
        handle = self.runtime.handles.get(replica)
        if handle is not None:
            handle.kill("the process exited with code 9")

    @rule(
        call=CALLS,
        attempt=st.integers(1, 2),
        replica=REPLICAS,
        input=st.sampled_from(["ok", "raise"]),
    )
    def run_call(self, call: str, attempt: int, replica: str, input: str) -> None:
        msg = RunCall(
            call_id=call,
            attempt=attempt,
            replica_id=replica,
            function="f",
            input=input,
            stream=True,
            accepted_at=time.time(),
        )
        self.fresh.add((call, attempt))
        self.manager.run_call(msg)

    @invariant()
    def one_final_event_per_fresh_delivery(self) -> None:
        finals: dict[tuple[str, int], int] = {}
        for path, body in self.recorder.posts:
            if path.startswith("/v1/calls/") and body["kind"] in FINAL_CALL_EVENTS:
                key = (path.split("/")[3], body["attempt"])
                finals[key] = finals.get(key, 0) + 1
        assert finals == dict.fromkeys(self.fresh, 1)

    @invariant()
    def replica_states_follow_the_protocol(self) -> None:
        last: dict[str, Any] = {}
        for path, body in self.recorder.posts:
            if path.startswith("/v1/replicas/"):
                replica = path.split("/")[3]
                previous = last.get(replica)
                if previous in ("stopped", "failed"):
                    previous = None  # a replica id may be started again after it ended
                assert body["state"] in ALLOWED_NEXT[previous], (previous, body["state"])
                last[replica] = body["state"]


TestManagerMachine = ManagerMachine.TestCase
TestManagerMachine.settings = settings(max_examples=60, stateful_step_count=20, deadline=None)
