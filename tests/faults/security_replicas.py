"""A ReplicaManager over real replica processes running ``security_functions``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx

from control_plane.protocol import RunCall, StartReplica
from tests.worker.recorder import Recorder
from worker.child_protocol import ReplicaSpec
from worker.replicas import ReplicaManager
from worker.runtimes.base import OnExit
from worker.runtimes.process import ProcessReplica, ProcessRuntime

FUNCTIONS = Path(__file__).parent / "security_functions"
BUNDLE = "blake3:" + "0" * 64


class LocalCodeRuntime(ProcessRuntime):
    """Runs ``security_functions`` from its directory instead of a pushed bundle."""

    def start(self, spec: ReplicaSpec, on_exit: OnExit) -> ProcessReplica:
        return super().start(spec.model_copy(update={"bundle_dir": str(FUNCTIONS)}), on_exit)


def start(
    manager: ReplicaManager, entry: str, secrets: dict[str, str], replica_id: str = "r1"
) -> None:
    manager.start_replica(
        StartReplica(
            replica_id=replica_id,
            function="f",
            version=1,
            bundle_digest=BUNDLE,
            entry=entry,
            secrets=secrets,
        )
    )


def run(manager: ReplicaManager, recorder: Recorder, call_id: str, input: Any, **kw: Any) -> Any:
    """Run one call to its end; return the events the worker posted for it."""
    msg = RunCall(
        call_id=call_id, replica_id="r1", function="f", input=input, accepted_at=time.time(), **kw
    )
    manager.run_call(msg)
    return recorder.events(f"/v1/calls/{call_id}/")


class SmallBodyRecorder(Recorder):
    """A recorder that, like the control plane, answers 413 to a body over ``max_body_bytes``."""

    def __init__(self, max_body_bytes: int) -> None:
        super().__init__()
        self.max_body_bytes = max_body_bytes

    def handler(self, request: httpx.Request) -> httpx.Response:
        if len(request.content) > self.max_body_bytes:
            return httpx.Response(413, json={"detail": "request body exceeds the cap"})
        return super().handler(request)
