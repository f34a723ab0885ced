"""One runtime per kind of replica: processes, and containers for ``runtime = "docker"``.

``RoutedRuntime`` is what the agent holds: a spec that names a container
goes to the Docker runtime, made on first use (a worker without an engine
still serves process functions, and says why it cannot start a container),
everything else to the process runtime.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from worker.child_protocol import ReplicaSpec
from worker.runtimes.base import OnExit, ReplicaHandle, ReplicaStartError, Runtime


class RoutedRuntime(Runtime):
    def __init__(self, process: Runtime, make_docker: Callable[[], Runtime]) -> None:
        self.process = process
        self._make_docker = make_docker
        self._docker: Runtime | None = None
        self._lock = threading.Lock()

    def docker(self) -> Runtime:
        with self._lock:
            if self._docker is None:
                try:
                    self._docker = self._make_docker()
                except Exception as exc:  # the engine's SDK raises many kinds
                    raise ReplicaStartError(
                        f"this worker cannot run containers: {exc}; install and start Docker "
                        '(make system-deps) or deploy the function with runtime = "process"'
                    ) from None
            return self._docker

    def start(self, spec: ReplicaSpec, on_exit: OnExit) -> ReplicaHandle:
        runtime = self.docker() if spec.container is not None else self.process
        return runtime.start(spec, on_exit)

    def prewarm_device(self, device: str) -> None:
        self.process.prewarm_device(device)

    def pool_counts(self) -> tuple[int, int] | None:
        return self.process.pool_counts()

    def close(self) -> None:
        self.process.close()
        with self._lock:
            if self._docker is not None:
                self._docker.close()
