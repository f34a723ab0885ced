"""The canary's share of calls: a pure function of an injected uniform draw."""

from __future__ import annotations

import random

import pytest

from control_plane.services.canary import CanaryState, pick_version

CANARY = CanaryState(version=7, weight_pct=10.0, started_at=0.0)


def test_without_a_canary_every_call_goes_to_the_active_version() -> None:
    assert {pick_version(3, None, d / 100) for d in range(100)} == {3}


def test_the_canary_takes_draws_below_its_share() -> None:
    assert pick_version(3, CANARY, 0.0) == 7
    assert pick_version(3, CANARY, 0.0999) == 7
    assert pick_version(3, CANARY, 0.1) == 3
    assert pick_version(3, CANARY, 0.999999) == 3


@pytest.mark.parametrize("weight_pct", [1.0, 10.0, 50.0, 90.0])
def test_split_over_many_draws_is_within_half_a_point(weight_pct: float) -> None:
    rng = random.Random(1234)  # seeded: the same draws every run
    canary = CanaryState(version=2, weight_pct=weight_pct, started_at=0.0)
    n = 100_000
    to_canary = sum(pick_version(1, canary, rng.random()) == 2 for _ in range(n))
    assert abs(to_canary / n * 100 - weight_pct) < 0.5


@pytest.mark.parametrize("draw", [-0.1, 1.0, 2.0])
def test_a_draw_outside_the_unit_interval_is_refused(draw: float) -> None:
    with pytest.raises(ValueError, match="draw must be in"):
        pick_version(1, CANARY, draw)
