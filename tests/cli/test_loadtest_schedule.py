"""Arrival schedules of ``thaw loadtest --rate``: seeded, within the run, at the rate."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cli.loadtest_schedule import (
    ScheduleError,
    arrivals,
    bursty_arrivals,
    constant_arrivals,
    poisson_arrivals,
)


def test_constant_is_evenly_spaced() -> None:
    assert constant_arrivals(4.0, 1.0) == [0.0, 0.25, 0.5, 0.75]
    assert constant_arrivals(2.0, 1.6) == [0.0, 0.5, 1.0, 1.5]
    assert constant_arrivals(0.5, 1.0) == [0.0]


def test_poisson_is_seeded_and_near_the_rate() -> None:
    a = poisson_arrivals(50.0, 100.0, seed=7)
    assert a == poisson_arrivals(50.0, 100.0, seed=7)
    assert a != poisson_arrivals(50.0, 100.0, seed=8)
    assert 4500 < len(a) < 5500
    gaps = [b - a_ for a_, b in itertools.pairwise(a)]
    assert abs(sum(gaps) / len(gaps) - 0.02) < 0.002


def test_bursty_leaves_the_idle_gaps_empty() -> None:
    a = bursty_arrivals(20.0, 60.0, burst_s=5.0, idle_gap_s=10.0, seed=1)
    # Bursts at [0, 5), [15, 20), [30, 35), [45, 50); nothing in between.
    assert all(t % 15.0 < 5.0 for t in a)
    assert {int(t // 15) for t in a} == {0, 1, 2, 3}
    assert 4 * 5 * 20 * 0.8 < len(a) < 4 * 5 * 20 * 1.2
    assert a == arrivals("bursty", 20.0, 60.0, burst_s=5.0, idle_gap_s=10.0, seed=1)


@given(
    kind=st.sampled_from(["constant", "poisson", "bursty"]),
    rate=st.floats(0.1, 200.0),
    duration=st.floats(0.1, 20.0),
    seed=st.integers(0, 2**32),
)
def test_every_schedule_is_sorted_and_within_the_run(
    kind: str, rate: float, duration: float, seed: int
) -> None:
    a = arrivals(kind, rate, duration, burst_s=1.0, idle_gap_s=2.0, seed=seed)  # type: ignore[arg-type]
    assert a == sorted(a)
    assert all(0.0 <= t < duration for t in a)


@pytest.mark.parametrize(
    ("rate", "duration", "kw"),
    [(0.0, 1.0, {}), (1.0, 0.0, {}), (1.0, 1.0, {"burst_s": 0.0}), (1.0, 1.0, {"idle_gap_s": -1})],
)
def test_parameters_that_make_no_schedule_are_refused(
    rate: float, duration: float, kw: dict[str, float]
) -> None:
    with pytest.raises(ScheduleError):
        arrivals("bursty", rate, duration, **kw)  # type: ignore[arg-type]
