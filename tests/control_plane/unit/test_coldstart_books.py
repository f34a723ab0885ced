"""Pure helpers of the cold-start books: schedule and first-output phases, phase
medians, p90/p99, and a worker inventory's round trip through its JSON column."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from control_plane.protocol import TierBandwidths, TierHolding, WorkerHeartbeat
from control_plane.services import inventory
from control_plane.services.coldstart import first_output_ms, schedule_ms
from control_plane.services.scheduler import DEFAULT_BANDWIDTHS, Holding
from control_plane.services.stats import phase_medians, summarize


def test_schedule_runs_from_request_to_send() -> None:
    assert schedule_ms(100.0, 100.25) == 250.0
    assert schedule_ms(100.0, None) is None  # not sent yet
    assert schedule_ms(None, 100.0) is None
    assert schedule_ms(100.0, 99.0) == 0.0  # clocks of two processes: never negative


def test_first_output_runs_from_ready() -> None:
    assert first_output_ms(10.0, 10.5) == 500.0
    assert first_output_ms(None, 10.5) is None


def test_phase_medians_in_phase_order_over_the_starts_that_recorded_them() -> None:
    starts = [
        {"weights_fetch": 30.0, "schedule": 1.0, "custom": 9.0},
        {"weights_fetch": 10.0, "schedule": 3.0},
        {"weights_fetch": 20.0, "schedule": 2.0, "first_output": 5.0},
    ]
    medians = phase_medians(starts)
    assert list(medians) == ["schedule", "weights_fetch", "first_output", "custom"]
    assert medians == {"schedule": 2.0, "weights_fetch": 20.0, "first_output": 5.0, "custom": 9.0}
    assert phase_medians([]) == {}


@given(st.lists(st.floats(0, 1e6), min_size=1, max_size=60))
def test_summary_percentiles_are_ordered_observed_values(values: list[float]) -> None:
    s = summarize(values)
    ps = [s.p50_ms, s.p90_ms, s.p95_ms, s.p99_ms]
    assert all(p in values for p in ps)
    assert ps == sorted(ps)  # type: ignore[type-var]


def test_inventory_round_trip_and_defaults() -> None:
    hb = WorkerHeartbeat(
        holdings=[TierHolding(tier="ram", digest="blake3:m", bytes=7)],
        bandwidths=TierBandwidths(disk_bytes_per_s=3e9),
        pool_idle=2,
    )
    inv = inventory.decode(inventory.encode(hb))
    assert inv.holdings == (Holding("ram", "blake3:m", 7),)
    assert inv.bandwidths.disk_bytes_per_s == 3e9
    assert inv.bandwidths.store_bytes_per_s == DEFAULT_BANDWIDTHS.store_bytes_per_s
    assert (inv.pool_idle, inv.pool_busy) == (2, None)
    assert inventory.decode("{}") == inventory.WorkerInventory()


def test_old_heartbeat_without_inventory_still_parses() -> None:
    hb = WorkerHeartbeat.model_validate({"v": 1, "cached_manifests": ["blake3:m"]})
    assert hb.holdings == [] and hb.bandwidths == TierBandwidths() and hb.pool_idle is None
