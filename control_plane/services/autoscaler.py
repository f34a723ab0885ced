"""How many replicas a function should have. A pure function of (state, now).

load      = in-flight + queued calls
desired   = ceil(load / target_concurrency)          when load > 0
          = current replicas                         when idle < idle_timeout_s
          = 0                                        after idle_timeout_s without calls
result    = clamp(desired, min_replicas, max_replicas)
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class ScaleState:
    min_replicas: int
    max_replicas: int
    idle_timeout_s: float
    target_concurrency: int
    in_flight: int
    queued: int
    current_replicas: int  # pending + starting + ready
    last_call_at: float | None  # unix s of the latest accepted or finished call


def load_replicas(load: int, target_concurrency: int) -> int:
    return math.ceil(load / max(1, target_concurrency))


def is_idle(last_call_at: float | None, idle_timeout_s: float, now: float) -> bool:
    return last_call_at is None or now - last_call_at >= idle_timeout_s


def clamp(n: int, low: int, high: int) -> int:
    return max(low, min(high, n))


def desired_replicas(state: ScaleState, now: float) -> int:
    """The replica target for one function at ``now``."""
    load = state.in_flight + state.queued
    if load > 0:
        desired = load_replicas(load, state.target_concurrency)
    elif is_idle(state.last_call_at, state.idle_timeout_s, now):
        desired = 0
    else:
        desired = state.current_replicas
    return clamp(desired, state.min_replicas, max(state.min_replicas, state.max_replicas))
