"""The thaw side of the cold-start bench: calls through the public HTTP API, timed by the client.

Every sample is one ``POST /v1/functions/{name}/invoke`` timed from before
the request to the end of the response (``total_s``), with ``X-Thaw-Cold``
and the ``Server-Timing`` entries (cold-start phases and call timings, in
ms) read from the response. Nothing here reads the worker's internals.
"""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx

from bench._coldstart_setup import ADAPTERS, BenchStack

PROMPT_BODY = {"prompt": "Hello", "max_tokens": 1}  # one forward pass, like the naive row
_ENTRY = re.compile(r"^\s*([A-Za-z0-9_-]+);dur=([0-9.eE+-]+)\s*$")
# Phases the cold start reports; the rest of Server-Timing are call timings.
CALL_TIMINGS = {"queue_wait", "execution", "first_output", "total", "control_plane"}


@dataclass(frozen=True)
class Sample:
    total_s: float
    cold: bool
    server_timing_ms: dict[str, float] = field(default_factory=dict)

    @property
    def phases_ms(self) -> dict[str, float]:
        return {k: v for k, v in self.server_timing_ms.items() if k not in CALL_TIMINGS}

    @property
    def pool_hit(self) -> bool:
        """Served by a pooled process: the worker zeroes the generic phases it paid before
        the request (``process_start``); a process spawned on demand reports its own.
        ``imports`` is not a signal: it also times loading the function's code."""
        return self.server_timing_ms.get("process_start", 0.0) == 0.0


def parse_server_timing(header: str) -> dict[str, float]:
    """``a;dur=1.5, b;dur=2`` → ``{"a": 1.5, "b": 2.0}``; entries without ``dur`` are skipped."""
    out: dict[str, float] = {}
    for part in header.split(","):
        m = _ENTRY.match(part)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def timed_call(stack: BenchStack, function: str, adapter: str | None = None) -> Sample:
    body: dict[str, object] = {"input": PROMPT_BODY}
    if adapter is not None:
        body["adapter"] = adapter
    response, seconds = stack.timed_invoke(function, body)
    return _sample(response, seconds)


def _sample(response: httpx.Response, total_s: float) -> Sample:
    cold = response.headers.get("X-Thaw-Cold") == "true"
    return Sample(total_s, cold, parse_server_timing(response.headers.get("Server-Timing", "")))


def cold_call(stack: BenchStack, function: str) -> Sample:
    """One call that must be a cold start; raises when the platform served it warm."""
    sample = timed_call(stack, function)
    if not sample.cold:
        raise RuntimeError(
            f"{function}: expected a cold start after scaling to zero, got a warm call; "
            "is the idle timeout longer than the bench waits?"
        )
    return sample


def warm_calls(stack: BenchStack, function: str, n: int) -> list[Sample]:
    """``n`` calls to a live replica; the first (possibly cold) call is made and dropped."""
    timed_call(stack, function)
    samples = [timed_call(stack, function) for _ in range(n)]
    cold = sum(s.cold for s in samples)
    if cold:
        raise RuntimeError(f"{function}: {cold} of {n} warm calls were cold; the replica stopped")
    return samples


@dataclass(frozen=True)
class SwitchSamples:
    switch: list[Sample]  # a call whose adapter differs from the previous call's
    same: list[Sample]  # the next call, same adapter (the paired baseline)

    def overhead_s(self) -> list[float]:
        """What switching cost: the ``adapter_switch`` phase the function measures around
        its ``set_adapter`` (``CallContext.timings_ms``) on each switch call. A function
        that does not report it is measured the old way: its execution minus the paired
        same-adapter call's (a difference of two forward passes, with their jitter)."""
        measured = [s.server_timing_ms.get("adapter_switch") for s in self.switch]
        if all(ms is not None for ms in measured):
            return [float(ms) / 1000 for ms in measured if ms is not None]
        return [
            max(0.0, _exec_s(a) - _exec_s(b)) for a, b in zip(self.switch, self.same, strict=True)
        ]


def _exec_s(sample: Sample) -> float:
    exec_ms = sample.server_timing_ms.get("execution")
    return sample.total_s if exec_ms is None else exec_ms / 1000


def adapter_switches(stack: BenchStack, function: str, n: int) -> SwitchSamples:
    """``n`` pairs on a warm replica: adapter A (a switch), A again (no switch), then B, B…"""
    timed_call(stack, function, ADAPTERS[-1])
    switch, same = [], []
    for i in range(n):
        adapter = ADAPTERS[i % len(ADAPTERS)]
        switch.append(timed_call(stack, function, adapter))
        same.append(timed_call(stack, function, adapter))
    if any(s.cold for s in switch + same):
        raise RuntimeError(f"{function}: a call during the adapter switches was cold")
    return SwitchSamples(switch, same)


@dataclass(frozen=True)
class TraceShape:
    bursts: int
    calls_per_burst: int
    arrival_gap_s: float  # between calls inside a burst
    idle_gap_s: float  # between bursts; longer than the function's idle timeout


def bursty_trace(stack: BenchStack, function: str, shape: TraceShape) -> list[Sample]:
    """Bursts of overlapping calls separated by idle gaps; every call's sample, in order."""
    samples: list[Sample] = []
    with ThreadPoolExecutor(max_workers=shape.calls_per_burst) as pool:
        for burst in range(shape.bursts):
            if burst:
                time.sleep(shape.idle_gap_s)
            futures = []
            for _ in range(shape.calls_per_burst):
                futures.append(pool.submit(timed_call, stack, function))
                time.sleep(shape.arrival_gap_s)
            samples.extend(f.result() for f in futures)
    return samples


def wait_ready_replica(stack: BenchStack, function: str, timeout_s: float = 300.0) -> None:
    """Until keep-warm (``min_replicas``) has a ready replica of ``function``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        states = [
            r["state"] for w in stack.workers() for r in w["replicas"] if r["function"] == function
        ]
        if "ready" in states:
            return
        time.sleep(0.2)
    raise RuntimeError(f"{function}: no ready replica after {timeout_s:g} s\n{stack.logs()}")
