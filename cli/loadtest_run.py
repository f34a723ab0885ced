"""Driving a function for ``thaw loadtest``: the clients, and the queue-depth sampler.

Two ways to load it:

    closed loop (--concurrency N)   N clients, each sending its next call as soon
                                    as the last one ended
    open loop (--rate R)            calls sent at the times of an arrival schedule
                                    (``cli.loadtest_schedule``), whether or not
                                    earlier ones have ended

In the open loop a call's latency counts from the time it was due, so time
spent waiting for a free client thread is not hidden (coordinated omission).
Every call is a real ``POST /v1/functions/NAME/invoke``: synchronous, or
server-sent events with ``--stream`` (time to first output is then the first
``output`` event; for a synchronous call it is the whole call); on an LLM
function, a streamed OpenAI request (:mod:`cli.loadtest_llm`). Each client
thread holds its own keep-alive connection.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from cli.loadtest_llm import CallIndex, LlmLoad, stream_call


@dataclass(frozen=True)
class Target:
    server_url: str
    api_key: str
    function: str
    input: Any = None
    stream: bool = False
    timeout_s: float = 330.0
    llm: LlmLoad | None = None  # an LLM function: OpenAI streams instead of invoke
    index: CallIndex = field(default_factory=CallIndex, compare=False)


@dataclass(frozen=True)
class CallSample:
    start_s: float  # offset from the run's start: when the call was due (or sent)
    latency_s: float
    ttft_s: float | None
    cold: bool | None  # X-Thaw-Cold; None when the answer did not say
    ok: bool
    status: int  # HTTP status; 0 when no response came
    error: str | None = None
    # LLM calls only:
    tpot_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    call_id: str | None = None


@dataclass(frozen=True)
class QueueSample:
    t_s: float
    queue_depth: float
    ready_replicas: float


@dataclass
class Recorder:
    """What the clients saw so far; shared by the client threads and the progress line."""

    t0: float = field(default_factory=time.perf_counter)
    calls: list[CallSample] = field(default_factory=list)
    queue: list[QueueSample] = field(default_factory=list)
    queue_note: str | None = None  # why queue depth was not sampled
    in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def now_s(self) -> float:
        return time.perf_counter() - self.t0

    def add(self, sample: CallSample) -> None:
        with self.lock:
            self.calls.append(sample)

    def snapshot(self) -> tuple[int, int, int]:
        """(calls ended, errors, in flight)."""
        with self.lock:
            return len(self.calls), sum(not c.ok for c in self.calls), self.in_flight


@contextmanager
def http_client(target: Target) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {target.api_key}"}
    with httpx.Client(base_url=target.server_url, headers=headers, timeout=target.timeout_s) as c:
        yield c


def one_call(c: httpx.Client, target: Target, rec: Recorder, due_s: float) -> CallSample:
    """Send one call; a failure is recorded in the sample, never raised."""
    with rec.lock:
        rec.in_flight += 1
    try:
        if target.llm is not None:
            return _llm(c, target.llm, target.index.take(), rec, due_s)
        if target.stream:
            return _streamed(c, target, rec, due_s)
        return _sync(c, target, rec, due_s)
    except httpx.HTTPError as exc:
        return CallSample(due_s, rec.now_s() - due_s, None, None, False, 0, f"{exc!r}")
    finally:
        with rec.lock:
            rec.in_flight -= 1


def _cold(r: httpx.Response) -> bool | None:
    value = r.headers.get("X-Thaw-Cold")
    return None if value is None else value == "true"


def _sync(c: httpx.Client, target: Target, rec: Recorder, due_s: float) -> CallSample:
    r = c.post(f"/v1/functions/{target.function}/invoke", json={"input": target.input})
    latency_s = rec.now_s() - due_s
    ok = r.status_code == 200
    error = None if ok else f"{r.status_code} {r.text[:200]}"
    ttft_s = latency_s if ok else None  # the whole result is the first output
    return CallSample(due_s, latency_s, ttft_s, _cold(r), ok, r.status_code, error)


def _streamed(c: httpx.Client, target: Target, rec: Recorder, due_s: float) -> CallSample:
    path = f"/v1/functions/{target.function}/invoke"
    headers = {"Accept": "text/event-stream"}
    ttft_s: float | None = None
    error: str | None = None
    with c.stream("POST", path, json={"input": target.input}, headers=headers) as r:
        if r.status_code != 200:
            r.read()
            error = f"{r.status_code} {r.text[:200]}"
        event = ""
        for line in r.iter_lines() if error is None else ():
            if line.startswith("event: "):
                event = line[len("event: ") :]
                if event == "output" and ttft_s is None:
                    ttft_s = rec.now_s() - due_s
            elif line.startswith("data: ") and event == "error":
                error = _stream_error(json.loads(line[len("data: ") :]))
    latency_s = rec.now_s() - due_s
    ok = error is None
    return CallSample(due_s, latency_s, ttft_s if ok else None, _cold(r), ok, r.status_code, error)


def _llm(c: httpx.Client, load: LlmLoad, i: int, rec: Recorder, due_s: float) -> CallSample:
    res = stream_call(c, load, i, lambda: rec.now_s() - due_s)
    ok = res.error is None
    return CallSample(
        due_s,
        rec.now_s() - due_s,
        res.ttft_s if ok else None,
        res.cold,
        ok,
        res.status,
        res.error,
        tpot_s=res.tpot_s if ok else None,
        prompt_tokens=res.prompt_tokens,
        completion_tokens=res.completion_tokens,
        call_id=res.call_id,
    )


def _stream_error(payload: Any) -> str:
    """The ``error`` event's data: the call (its status and error), or a message."""
    if isinstance(payload, dict):
        return f"{payload.get('status', 'error')}: {payload.get('error')}"
    return f"error: {payload}"


def run_closed(target: Target, concurrency: int, duration_s: float, rec: Recorder) -> None:
    """``concurrency`` clients calling back to back until ``duration_s`` has passed."""

    def client() -> None:
        with http_client(target) as c:
            while rec.now_s() < duration_s:
                rec.add(one_call(c, target, rec, rec.now_s()))

    threads = [threading.Thread(target=client, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def run_open(target: Target, schedule: list[float], rec: Recorder, max_in_flight: int) -> None:
    """One call at each offset of ``schedule``, at most ``max_in_flight`` at once."""
    local = threading.local()
    clients: list[httpx.Client] = []
    clients_lock = threading.Lock()

    def client() -> httpx.Client:
        if not hasattr(local, "client"):
            headers = {"Authorization": f"Bearer {target.api_key}"}
            local.client = httpx.Client(
                base_url=target.server_url, headers=headers, timeout=target.timeout_s
            )
            with clients_lock:
                clients.append(local.client)
        c: httpx.Client = local.client
        return c

    with ThreadPoolExecutor(max_workers=max_in_flight, thread_name_prefix="loadtest") as pool:
        for due_s in schedule:
            wait_s = due_s - rec.now_s()
            if wait_s > 0:
                time.sleep(wait_s)
            pool.submit(_call_and_record, client, target, rec, due_s)
    for c in clients:
        c.close()


def _call_and_record(
    client: Callable[[], httpx.Client], target: Target, rec: Recorder, due_s: float
) -> None:
    rec.add(one_call(client(), target, rec, due_s))


# --- queue depth -----------------------------------------------------------------


def queue_sample(text: str, function: str, t_s: float) -> QueueSample:
    """Queue depth and ready replicas of ``function`` from a /metrics exposition."""
    depth = ready = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.labels.get("function") != function:
                continue
            if s.name == "thaw_queue_depth":
                depth = max(depth, s.value)
            elif s.name == "thaw_replicas" and s.labels.get("state") == "ready":
                ready = max(ready, s.value)
    return QueueSample(t_s, depth, ready)


def sample_queue(target: Target, rec: Recorder, interval_s: float, stop: threading.Event) -> None:
    """Scrape /metrics every ``interval_s`` until ``stop``; needs an admin key."""
    with http_client(target) as c:
        while not stop.is_set():
            try:
                r = c.get("/metrics")
            except httpx.HTTPError as exc:
                rec.queue_note = f"/metrics unreachable: {exc!r}"
                return
            if r.status_code != 200:
                rec.queue_note = f"/metrics answered {r.status_code} (it needs an admin key)"
                return
            sample = queue_sample(r.text, target.function, rec.now_s())
            with rec.lock:
                rec.queue.append(sample)
            stop.wait(interval_s)


def drive(
    target: Target,
    load: Callable[[Recorder], None],
    queue_interval_s: float,
    rec: Recorder,
) -> None:
    """Run ``load`` while sampling the queue; returns when every call has ended."""
    stop = threading.Event()
    sampler = threading.Thread(
        target=sample_queue, args=(target, rec, queue_interval_s, stop), daemon=True
    )
    sampler.start()
    try:
        load(rec)
    finally:
        stop.set()
        sampler.join(timeout=5)
