"""How many replicas a function should have. Pure functions of (state, history, now).

The trigger is queue depth per replica, not utilization (which lags the
tail): every queued call counts as load the moment it is accepted::

    load         = in-flight + queued calls
    recommended  = clamp(ceil(load / target_concurrency), min, max)   (0 load: min)

Recommendations are stabilized like the Kubernetes HPA's behavior windows,
over the history of recent recommendations (:class:`Recommendation`)::

    up    = lowest recommendation over the last scale_up_window_s   (0 s: the current one)
    down  = highest recommendation over the last scale_down_window_s
    target = up when current < up; down when current > down; else current

so a burst scales up at once, and replicas it brought stay until no
recommendation in the down window wanted them. Scale to zero is the idle
timeout's own business: with no load the target is the current count until
``idle_timeout_s`` passes without calls, then 0 (clamped to ``min_replicas``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
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


@dataclass(frozen=True)
class Windows:
    """Stabilization windows, seconds (``Settings.scale_up_window_s`` and ``..._down_...``)."""

    scale_up_s: float = 0.0
    scale_down_s: float = 60.0


@dataclass(frozen=True)
class Recommendation:
    """A recommendation that held from ``since`` until the next one's ``since`` (or now)."""

    since: float  # unix s
    replicas: int


History = tuple[Recommendation, ...]


def load_replicas(load: int, target_concurrency: int) -> int:
    return math.ceil(load / max(1, target_concurrency))


def is_idle(last_call_at: float | None, idle_timeout_s: float, now: float) -> bool:
    return last_call_at is None or now - last_call_at >= idle_timeout_s


def clamp(n: int, low: int, high: int) -> int:
    return max(low, min(high, n))


def _bounds(state: ScaleState) -> tuple[int, int]:
    return state.min_replicas, max(state.min_replicas, state.max_replicas)


def recommended_replicas(state: ScaleState) -> int:
    """What the load alone asks for now, clamped to [min, max]."""
    load = state.in_flight + state.queued
    return clamp(load_replicas(load, state.target_concurrency), *_bounds(state))


def desired_replicas(state: ScaleState, now: float) -> int:
    """The replica target at ``now`` without stabilization (both windows 0 s)."""
    target, _ = decide(state, (), Windows(0.0, 0.0), now)
    return target


def record(history: Sequence[Recommendation], now: float, replicas: int, keep_s: float) -> History:
    """``history`` with ``replicas`` recommended at ``now``, less what ended over ``keep_s`` ago.

    A recommendation equal to the latest one extends it (no new entry), so the
    history changes only when the recommendation does.
    """
    kept = list(history)
    if not kept or kept[-1].replicas != replicas:
        kept.append(Recommendation(now, replicas))
    horizon = now - max(0.0, keep_s)
    # Entry i ends where entry i + 1 begins; the last one runs until now.
    first = 0
    while first < len(kept) - 1 and kept[first + 1].since <= horizon:
        first += 1
    return tuple(kept[first:])


def in_window(history: Sequence[Recommendation], now: float, window_s: float) -> list[int]:
    """Recommendations that held at some moment of (now - window_s, now]; never empty
    when ``history`` is not (the latest always counts)."""
    horizon = now - max(0.0, window_s)
    values = []
    for i, rec in enumerate(history):
        last = i == len(history) - 1
        if last or history[i + 1].since > horizon:
            values.append(rec.replicas)
    return values


def stabilize(current: int, history: Sequence[Recommendation], now: float, w: Windows) -> int:
    """The HPA rule: up to the window's lowest, down to the window's highest, else stay."""
    if not history:
        return current
    up = min(in_window(history, now, w.scale_up_s))
    down = max(in_window(history, now, w.scale_down_s))
    if current < up:
        return up
    if current > down:
        return down
    return current


def decide(
    state: ScaleState, history: Sequence[Recommendation], windows: Windows, now: float
) -> tuple[int, History]:
    """The replica target at ``now`` and the history to pass next time."""
    keep_s = max(windows.scale_up_s, windows.scale_down_s)
    new_history = record(history, now, recommended_replicas(state), keep_s)
    if state.in_flight + state.queued > 0:
        target = stabilize(state.current_replicas, new_history, now, windows)
    elif is_idle(state.last_call_at, state.idle_timeout_s, now):
        target = 0
    else:
        target = state.current_replicas
    return clamp(target, *_bounds(state)), new_history
