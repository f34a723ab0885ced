"""A worker stand-in for control-plane tests: real HTTP, real protocol messages.

It registers and heartbeats through the served API with a ``worker`` key,
consumes its queue from the ``InMemoryDispatcher`` (the same JSON a Celery
worker would get), and answers with ReplicaEvents and CallEvents. What a call
does is read from its input (a dict):

    {"sleep_s": 0.5}          sleep before answering
    {"fail": "boom"}          end as failed with that error
    {"chunks": 3}             with stream: three outputs, then succeeded
    {"tokens": [12, 30]}      its end reports 12 prompt and 30 completion tokens
    {"timings_ms": {"ttft": 8}} its end reports these timings too (an LLM replica's)
    anything else             succeeded with {"echo": input, "adapter": adapter}

A call with an adapter reports ``adapter_hit`` (a miss the first time a
replica sees that adapter, with an ``adapter_load`` timing) and
``loaded_adapters`` (the listed ones and every one its calls named). With
``phases_ms`` a replica start sleeps each phase's duration and reports what
each really took (at least the planned time). ``holdings``, ``bandwidths``
and ``pool_idle``/``pool_busy`` go into every heartbeat.
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
from typing import Any

import httpx

from control_plane.dispatch.memory import InMemoryDispatcher
from control_plane.protocol import (
    TASK_RUN_CALL,
    TASK_START_REPLICA,
    TASK_STOP_REPLICA,
    CallEvent,
    DeviceInfo,
    HeartbeatReply,
    ReplicaEvent,
    ReplicaReport,
    RunCall,
    StartReplica,
    StopReplica,
    TierBandwidths,
    TierHolding,
    TokenUsage,
    WorkerHeartbeat,
    WorkerRegister,
)


class FakeWorker:
    def __init__(
        self,
        base_url: str,
        token: str,
        dispatcher: InMemoryDispatcher,
        *,
        start_delay_s: float = 0.0,
        fail_start: str | None = None,
        heartbeat_interval_s: float = 0.1,
        cached_manifests: list[str] | None = None,
        worker_id: str | None = None,
        holdings: list[TierHolding] | None = None,
        bandwidths: TierBandwidths | None = None,
        phases_ms: dict[str, float] | None = None,
        pool: tuple[int, int, int] | None = None,
        gpu_utilization_pct: list[float] | None = None,
    ) -> None:
        self.id = worker_id or uuid.uuid4().hex
        self.holdings = holdings or []
        self.bandwidths = bandwidths or TierBandwidths()
        self.phases_ms = phases_ms
        self.pool = pool  # (size, idle, busy)
        self.gpu_utilization_pct = gpu_utilization_pct
        self.adapters_seen: dict[str, set[str]] = {}
        self.adapters_listed: dict[str, set[str]] = {}
        self.http = httpx.Client(
            base_url=base_url, headers={"Authorization": f"Bearer {token}"}, timeout=30
        )
        self.inbox = dispatcher.queue_for(self.id)
        self.start_delay_s = start_delay_s
        self.fail_start = fail_start
        self.heartbeat_interval_s = heartbeat_interval_s
        self.cached_manifests = cached_manifests or []
        self.received: list[tuple[str, dict[str, Any]]] = []
        self.replicas: dict[str, str] = {}
        self.cancelled: set[str] = set()
        self.heartbeating = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # --- life -------------------------------------------------------------------
    def start(self) -> FakeWorker:
        msg = WorkerRegister(
            worker_id=self.id,
            name=f"fake-{self.id[:8]}",
            devices=[DeviceInfo(kind="cpu", name="cpu", memory_bytes=1 << 30)],
            memory_bytes=1 << 30,
            cached_manifests=self.cached_manifests,
        )
        assert self._post("/v1/workers/register", msg) == 200
        self.heartbeating.set()
        for target in (self._consume, self._heartbeat):
            t = threading.Thread(target=target, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in list(self._threads):
            t.join(5)
        self.http.close()

    # --- queue ------------------------------------------------------------------
    def _consume(self) -> None:
        while not self._stop.is_set():
            try:
                task, payload = self.inbox.get(timeout=0.05)
            except queue.Empty:
                continue
            self.received.append((task, payload))
            if task == TASK_START_REPLICA:
                self._spawn(self._start_replica, StartReplica.model_validate(payload))
            elif task == TASK_STOP_REPLICA:
                self._stop_replica(StopReplica.model_validate(payload))
            elif task == TASK_RUN_CALL:
                self._spawn(self._run_call, RunCall.model_validate(payload))

    def _spawn(self, fn: Any, msg: Any) -> None:
        t = threading.Thread(target=fn, args=(msg,), daemon=True)
        self._threads.append(t)
        t.start()

    def _post(self, path: str, body: Any) -> int:
        """POST unless the worker is stopping; the status code (0 when not sent)."""
        if self._stop.is_set():
            return 0
        try:
            return self.http.post(path, json=body.model_dump(mode="json")).status_code
        except (httpx.HTTPError, RuntimeError):
            return 0  # the server or this client is shutting down

    def _replica_event(self, replica_id: str, ev: ReplicaEvent) -> None:
        self._post(f"/v1/replicas/{replica_id}/events", ev)

    def _start_replica(self, msg: StartReplica) -> None:
        received = time.perf_counter()
        self.replicas[msg.replica_id] = "starting"
        self.adapters_listed[msg.replica_id] = {a.name for a in msg.adapters}
        self._replica_event(msg.replica_id, ReplicaEvent(state="starting"))
        if self._stop.wait(self.start_delay_s):
            return
        if self.fail_start is not None:
            self.replicas[msg.replica_id] = "failed"
            ev = ReplicaEvent(state="failed", error=self.fail_start, fault="function")
            self._replica_event(msg.replica_id, ev)
            return
        phases = {
            "pool_acquire": 1.0,
            "weights_fetch": self.start_delay_s * 1000,
            "user_setup": 2.0,
        }
        if self.phases_ms is not None:
            phases = self._timed_phases(received, self.phases_ms)
        self.replicas[msg.replica_id] = "ready"
        self._replica_event(msg.replica_id, ReplicaEvent(state="ready", phases_ms=phases))

    def _timed_phases(self, since: float, planned_ms: dict[str, float]) -> dict[str, float]:
        """Sleep each planned phase and report what it really took, as a worker
        measures: the first phase from the message's receipt."""
        measured = {}
        for name, ms in planned_ms.items():
            end = time.perf_counter() + ms / 1000
            self._stop.wait(max(0.0, end - time.perf_counter()))
            now = time.perf_counter()
            measured[name], since = (now - since) * 1000, now
        return measured

    def _stop_replica(self, msg: StopReplica) -> None:
        self.replicas[msg.replica_id] = "stopped"
        self._replica_event(msg.replica_id, ReplicaEvent(state="stopped"))

    def _call_event(self, msg: RunCall, **kw: Any) -> int:
        return self._post(f"/v1/calls/{msg.call_id}/events", CallEvent(attempt=msg.attempt, **kw))

    def _run_call(self, msg: RunCall) -> None:
        if self._call_event(msg, kind="started") == 409:
            return
        data = msg.input if isinstance(msg.input, dict) else {}
        deadline = time.monotonic() + float(data.get("sleep_s", 0))
        while time.monotonic() < deadline:
            if msg.call_id in self.cancelled or self._stop.is_set():
                self._call_event(msg, kind="cancelled")
                return
            time.sleep(0.01)
        usage = None
        if "tokens" in data:
            prompt, completion = data["tokens"]
            usage = TokenUsage(prompt_tokens=prompt, completion_tokens=completion)
        if "fail" in data:
            self._call_event(msg, kind="failed", error=str(data["fail"]), usage=usage)
            return
        if msg.stream:
            for i in range(int(data.get("chunks", 1))):
                self._call_event(msg, kind="output", output={"i": i})
        out = {"echo": msg.input, "adapter": msg.adapter}
        timings, hit, loaded = {"execution": 1.0, **data.get("timings_ms", {})}, None, None
        if msg.adapter is not None:
            seen = self.adapters_seen.setdefault(msg.replica_id, set())
            hit = msg.adapter in seen
            seen.add(msg.adapter)
            loaded = sorted(seen | self.adapters_listed.get(msg.replica_id, set()))
            if not hit:
                timings["adapter_load"] = 5.0
        self._call_event(
            msg,
            kind="succeeded",
            output=out,
            timings_ms=timings,
            adapter_hit=hit,
            loaded_adapters=loaded,
            usage=usage,
        )

    # --- heartbeats -------------------------------------------------------------
    def _heartbeat(self) -> None:
        while not self._stop.wait(self.heartbeat_interval_s):
            if not self.heartbeating.is_set():
                continue
            reports = [
                ReplicaReport(replica_id=rid, state=state)  # type: ignore[arg-type]
                for rid, state in list(self.replicas.items())
                if state in ("starting", "ready")
            ]
            size, idle, busy = self.pool if self.pool is not None else (0, None, None)
            msg = WorkerHeartbeat(
                replicas=reports,
                cached_manifests=self.cached_manifests,
                holdings=self.holdings,
                bandwidths=self.bandwidths,
                pool_size=size,
                pool_idle=idle,
                pool_busy=busy,
                gpu_utilization_pct=self.gpu_utilization_pct,
            )
            try:
                r = self.http.post(
                    f"/v1/workers/{self.id}/heartbeat", json=msg.model_dump(mode="json")
                )
            except (httpx.HTTPError, RuntimeError):
                continue
            if r.status_code == 200:
                reply = HeartbeatReply.model_validate(r.json())
                self.cancelled.update(reply.cancel_call_ids)
