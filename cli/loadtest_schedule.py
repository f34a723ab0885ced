"""When ``thaw loadtest --rate`` sends its calls: arrival schedules (pure, seeded).

Each generator returns the offsets (seconds from the start, ascending, within
``[0, duration_s)``) at which calls arrive::

    constant   one call every 1/rate s
    poisson    exponential gaps of mean 1/rate (independent arrivals)
    bursty     Poisson arrivals at ``rate`` during bursts of ``burst_s``,
               none during the ``idle_gap_s`` between them (scale-to-zero,
               then a cold start at the head of every burst)
"""

from __future__ import annotations

import random
from typing import Literal

Arrival = Literal["constant", "poisson", "bursty"]
ARRIVALS: tuple[Arrival, ...] = ("constant", "poisson", "bursty")


class ScheduleError(ValueError):
    """Arrival parameters that cannot make a schedule."""


def _check(rate_per_s: float, duration_s: float) -> None:
    if rate_per_s <= 0:
        raise ScheduleError(f"--rate must be above 0 calls/s, not {rate_per_s:g}")
    if duration_s <= 0:
        raise ScheduleError(f"--duration-s must be above 0, not {duration_s:g}")


def constant_arrivals(rate_per_s: float, duration_s: float) -> list[float]:
    _check(rate_per_s, duration_s)
    n = int(duration_s * rate_per_s - 1e-9) + 1
    return [i / rate_per_s for i in range(n) if i / rate_per_s < duration_s]


def poisson_arrivals(rate_per_s: float, duration_s: float, seed: int) -> list[float]:
    _check(rate_per_s, duration_s)
    rng = random.Random(seed)
    out: list[float] = []
    t = rng.expovariate(rate_per_s)
    while t < duration_s:
        out.append(t)
        t += rng.expovariate(rate_per_s)
    return out


def bursty_arrivals(
    rate_per_s: float, duration_s: float, burst_s: float, idle_gap_s: float, seed: int
) -> list[float]:
    _check(rate_per_s, duration_s)
    if burst_s <= 0 or idle_gap_s < 0:
        raise ScheduleError(
            f"bursts need --burst-s above 0 and --idle-gap-s at least 0 "
            f"(got {burst_s:g} and {idle_gap_s:g})"
        )
    rng = random.Random(seed)
    out: list[float] = []
    start = 0.0
    while start < duration_s:
        end = min(start + burst_s, duration_s)
        t = start + rng.expovariate(rate_per_s)
        while t < end:
            out.append(t)
            t += rng.expovariate(rate_per_s)
        start = end + idle_gap_s
    return out


def arrivals(
    kind: Arrival,
    rate_per_s: float,
    duration_s: float,
    *,
    burst_s: float = 5.0,
    idle_gap_s: float = 0.0,
    seed: int = 0,
) -> list[float]:
    """The schedule of ``kind``; raises ``ScheduleError`` for parameters that make none."""
    if kind == "constant":
        return constant_arrivals(rate_per_s, duration_s)
    if kind == "poisson":
        return poisson_arrivals(rate_per_s, duration_s, seed)
    if kind == "bursty":
        return bursty_arrivals(rate_per_s, duration_s, burst_s, idle_gap_s, seed)
    raise ScheduleError(f"unknown arrival {kind!r}; choose one of {', '.join(ARRIVALS)}")
