"""Autoscaling on queue depth with stabilization windows. Pure functions; the clock
is a number passed in, so nothing sleeps."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from control_plane.services.autoscaler import (
    History,
    Recommendation,
    ScaleState,
    Windows,
    decide,
    in_window,
    record,
    stabilize,
)

HPA_LIKE = Windows(scale_up_s=0, scale_down_s=60)


def scale(**kw: object) -> ScaleState:
    base: dict[str, object] = dict(
        min_replicas=0,
        max_replicas=10,
        idle_timeout_s=300.0,
        target_concurrency=2,
        in_flight=0,
        queued=0,
        current_replicas=0,
        last_call_at=0.0,
    )
    base.update(kw)
    return ScaleState(**base)  # type: ignore[arg-type]


def run(steps: list[tuple[float, ScaleState]], w: Windows = HPA_LIKE) -> list[int]:
    """Decide at each (now, state) in turn, threading the history as the reconciler does,
    with the current replica count following the previous target."""
    history: History = ()
    current = steps[0][1].current_replicas
    out = []
    for now, state in steps:
        state = ScaleState(**{**state.__dict__, "current_replicas": current})
        current, history = decide(state, history, w, now)
        out.append(current)
    return out


def test_queue_depth_scales_up_at_once() -> None:
    # 1 replica, 2 in flight and 5 queued at target 2 → ceil(7 / 2) = 4, no waiting.
    n, _ = decide(scale(in_flight=2, queued=5, current_replicas=1), (), HPA_LIKE, now=10)
    assert n == 4


def test_scale_down_waits_out_the_stabilization_window() -> None:
    burst = scale(queued=8)  # wants 4
    trickle = scale(in_flight=1)  # wants 1
    steps = [(0.0, burst), (10.0, trickle), (40.0, trickle), (69.5, trickle), (70.5, trickle)]
    # The burst's recommendation held until 10; it counts until 10 + 60 = 70.
    assert run(steps) == [4, 4, 4, 4, 1]


def test_without_a_window_scale_down_is_immediate() -> None:
    steps = [(0.0, scale(queued=8)), (1.0, scale(in_flight=1))]
    assert run(steps, Windows(0, 0)) == [4, 1]


def test_a_burst_inside_the_window_restarts_it() -> None:
    burst, lull = scale(queued=6), scale(in_flight=1)  # 3 and 1
    steps = [(0.0, burst), (30.0, lull), (50.0, burst), (100.0, lull), (159.0, lull), (161, lull)]
    assert run(steps) == [3, 3, 3, 3, 3, 1]


def test_scale_up_window_takes_the_lowest_recommendation() -> None:
    w = Windows(scale_up_s=20, scale_down_s=60)
    steps = [(0.0, scale(in_flight=1)), (5.0, scale(queued=8)), (24.0, scale(queued=8))]
    steps.append((25.5, scale(queued=8)))
    assert run(steps, w) == [1, 1, 1, 4]


def test_idle_timeout_scales_to_zero_whatever_the_window() -> None:
    burst = scale(queued=8, last_call_at=0.0, idle_timeout_s=5)
    idle = scale(last_call_at=0.0, idle_timeout_s=5)
    assert run([(0.0, burst), (4.0, idle), (5.0, idle)]) == [4, 4, 0]


def test_min_and_max_clamp_the_stabilized_target() -> None:
    assert run([(0.0, scale(queued=100, max_replicas=3))]) == [3]
    assert run([(0.0, scale(min_replicas=2, last_call_at=None))]) == [2]


def test_history_changes_only_when_the_recommendation_does_and_forgets_old_entries() -> None:
    h = record((), 0.0, 2, keep_s=60)
    assert record(h, 5.0, 2, keep_s=60) == h  # steady: nothing to write
    h = record(h, 10.0, 4, keep_s=60)
    h = record(h, 20.0, 1, keep_s=60)
    assert h == (Recommendation(0.0, 2), Recommendation(10.0, 4), Recommendation(20.0, 1))
    # At 75 the first entry (ended at 10) is out of the 60 s window; the second ended at 20.
    assert record(h, 75.0, 1, keep_s=60) == h[1:]
    assert in_window(h, 75.0, 60) == [4, 1]
    assert in_window(h, 81.0, 60) == [1]


def test_stabilize_stays_between_the_windows_bounds() -> None:
    h = (Recommendation(0.0, 5), Recommendation(10.0, 2))
    assert stabilize(3, h, 20.0, HPA_LIKE) == 3  # 2 ≤ 3 ≤ 5: stay
    assert stabilize(7, h, 20.0, HPA_LIKE) == 5
    assert stabilize(1, h, 20.0, HPA_LIKE) == 2
    assert stabilize(4, (), 20.0, HPA_LIKE) == 4


@given(
    st.lists(
        st.tuples(st.floats(0, 30), st.integers(0, 20), st.integers(0, 20)),
        min_size=1,
        max_size=12,
    ),
    st.floats(0, 120),
)
def test_never_below_the_load_and_never_above_the_windows_highest(
    steps: list[tuple[float, int, int]], down_s: float
) -> None:
    w = Windows(scale_up_s=0, scale_down_s=down_s)
    history: History = ()
    now, current, wanted = 0.0, 0, []
    for gap_s, in_flight, queued in steps:
        now += gap_s
        state = scale(in_flight=in_flight, queued=queued, current_replicas=current)
        if in_flight + queued == 0:
            continue  # idle handling is the idle timeout's
        current, history = decide(state, history, w, now)
        need = -(-(in_flight + queued) // 2)
        wanted.append((now, need))
        assert current >= min(need, 10)  # scale up is immediate
        # A recommendation holds until the next one; those that held within the window:
        pairs = itertools.pairwise(wanted)
        held = [n for (_, n), (t_next, _) in pairs if t_next > now - down_s]
        assert current <= max([*held, need])
