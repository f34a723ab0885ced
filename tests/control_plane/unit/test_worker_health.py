"""The worker circuit breaker's pure decision: closed, open, half-open (probe)."""

from __future__ import annotations

from control_plane.services.scheduler import WorkerSnapshot
from control_plane.services.worker_health import (
    BreakerState,
    Outcome,
    breaker_state,
    without_open,
)

FAIL, OK = True, False


def outcomes(*failed: bool, newest_at: float = 100.0) -> list[Outcome]:
    """Newest first, one second apart."""
    return [Outcome(f, newest_at - i) for i, f in enumerate(failed)]


def test_closed_until_threshold_consecutive_failures() -> None:
    assert breaker_state(outcomes(FAIL, FAIL), 3, 30, now=101, in_flight=0) == "closed"
    assert breaker_state(outcomes(FAIL, FAIL, OK, FAIL), 3, 30, now=101, in_flight=0) == "closed"
    assert breaker_state(outcomes(FAIL, FAIL, FAIL, OK), 3, 30, now=101, in_flight=0) == "open"


def test_a_success_closes_it() -> None:
    assert breaker_state(outcomes(OK, FAIL, FAIL, FAIL), 3, 30, now=101, in_flight=0) == "closed"


def test_half_open_after_the_probe_interval_with_nothing_in_flight() -> None:
    failing = outcomes(FAIL, FAIL, FAIL)
    assert breaker_state(failing, 3, 30, now=129, in_flight=0) == "open"
    assert breaker_state(failing, 3, 30, now=130, in_flight=0) == "half_open"
    # The probe is in flight: no second call until it ends.
    assert breaker_state(failing, 3, 30, now=130, in_flight=1) == "open"


def test_a_failed_probe_opens_it_for_another_interval() -> None:
    after_probe = outcomes(FAIL, FAIL, FAIL, newest_at=131)
    assert breaker_state(after_probe, 3, 30, now=140, in_flight=0) == "open"
    assert breaker_state(after_probe, 3, 30, now=161, in_flight=0) == "half_open"


def test_threshold_zero_is_off() -> None:
    assert breaker_state(outcomes(FAIL, FAIL, FAIL), 0, 30, now=500, in_flight=0) == "closed"


def snapshot(worker_id: str) -> WorkerSnapshot:
    return WorkerSnapshot(worker_id, True, frozenset({"cpu"}), 1 << 30, 0, 4)


def test_open_and_half_open_workers_get_no_replica_unless_probing() -> None:
    workers = [snapshot("closed"), snapshot("open"), snapshot("half")]
    breakers: dict[str, BreakerState] = {"open": "open", "half": "half_open"}
    healthy = {w.id for w in without_open(workers, breakers) if w.healthy}
    assert healthy == {"closed"}
    # No closed worker could take it: a half-open one may, its replica the probe.
    probing = {w.id for w in without_open(workers, breakers, probing=True) if w.healthy}
    assert probing == {"closed", "half"}
