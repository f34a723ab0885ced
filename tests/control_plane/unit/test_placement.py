"""Locality-aware placement: bytes missing per tier over each tier's bandwidth, plus load."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from control_plane.errors import NoCapacityError
from control_plane.services.scheduler import (
    DEFAULT_BANDWIDTHS,
    Bandwidths,
    Holding,
    ReplicaRequest,
    WorkerSnapshot,
    bytes_by_tier,
    estimated_start_s,
    place,
)

GIB = 1 << 30
MODEL = "blake3:model"
REQ = ReplicaRequest("f", "cpu", model_digest=MODEL, memory_bytes=2 * GIB)


def worker(wid: str, *held: tuple[str, int], **kw: object) -> WorkerSnapshot:
    base: dict[str, object] = dict(
        id=wid,
        healthy=True,
        device_kinds=frozenset({"cpu"}),
        free_memory_bytes=0,
        replicas=0,
        max_replicas=4,
        holdings=tuple(Holding(tier, MODEL, n) for tier, n in held),
    )
    base.update(kw)
    return WorkerSnapshot(**base)  # type: ignore[arg-type]


def test_ram_beats_disk_beats_store() -> None:
    store, disk, ram = worker("a"), worker("b", ("disk", 2 * GIB)), worker("c", ("ram", 2 * GIB))
    assert place(REQ, [store, disk, ram]).worker_id == "c"
    assert place(REQ, [store, disk]).worker_id == "b"
    p = place(REQ, [store])
    assert (p.source_tier, p.model_cached) == ("store", False)
    assert p.estimated_start_s == pytest.approx(2 * GIB / DEFAULT_BANDWIDTHS.store_bytes_per_s)


def test_placement_says_which_tier_serves_the_bytes() -> None:
    p = place(REQ, [worker("a", ("ram", GIB), ("disk", 2 * GIB))])
    assert dict(p.bytes_by_tier) == {"device": 0, "ram": GIB, "disk": GIB, "store": 0}
    assert (p.source_tier, p.model_cached) == ("disk", True)
    expected_s = (
        GIB / DEFAULT_BANDWIDTHS.ram_bytes_per_s + GIB / DEFAULT_BANDWIDTHS.disk_bytes_per_s
    )
    assert p.estimated_start_s == pytest.approx(expected_s)


def test_partial_disk_cache_fetches_only_the_rest() -> None:
    by_tier = bytes_by_tier(REQ, worker("a", ("disk", GIB // 2)))
    assert by_tier == {"device": 0, "ram": 0, "disk": GIB // 2, "store": 2 * GIB - GIB // 2}


def test_v1_cached_manifests_count_as_fully_on_disk() -> None:
    w = worker("a", cached_manifests=frozenset({MODEL}))
    assert bytes_by_tier(REQ, w)["disk"] == 2 * GIB


def test_measured_bandwidth_changes_the_choice() -> None:
    slow_disk = worker("a", ("disk", 2 * GIB), bandwidths=Bandwidths(disk_bytes_per_s=50e6))
    fast_store = worker("b", bandwidths=Bandwidths(store_bytes_per_s=2e9))
    assert place(REQ, [slow_disk, fast_store]).worker_id == "b"


def test_heavily_loaded_holder_loses_to_an_idle_worker() -> None:
    busy = worker("a", ("ram", 2 * GIB), replicas=3, starting_replicas=3, outstanding_calls=12)
    idle = worker("b")
    p = place(REQ, [busy, idle])
    assert p.worker_id == "b"
    assert p.estimated_start_s < estimated_start_s(REQ, busy)
    # Lightly loaded, the holder wins again.
    assert place(REQ, [worker("a", ("ram", 2 * GIB), replicas=1), idle]).worker_id == "a"


def test_ties_break_on_replicas_then_id() -> None:
    none = ReplicaRequest("f", "cpu")
    assert place(none, [worker("b"), worker("a")]).worker_id == "a"


def test_no_worker_with_capacity_says_why() -> None:
    with pytest.raises(NoCapacityError, match="full"):
        place(REQ, [worker("a", ("ram", 2 * GIB), replicas=4)])
    with pytest.raises(NoCapacityError, match="healthy"):
        place(REQ, [worker("a", healthy=False)])


tier_st = st.sampled_from(["device", "ram", "disk"])
held_st = st.lists(st.tuples(tier_st, st.integers(0, 4 * GIB)), max_size=3)


@given(held_st, st.integers(0, 4 * GIB))
def test_tiers_account_for_every_byte_once(held: list[tuple[str, int]], need: int) -> None:
    req = ReplicaRequest("f", "cpu", model_digest=MODEL, memory_bytes=need)
    by_tier = bytes_by_tier(req, worker("a", *held))
    assert all(n >= 0 for n in by_tier.values())
    most_held = max([n for _, n in held] + [0])
    assert sum(by_tier.values()) == (need or most_held)


@given(st.integers(1, 4 * GIB), st.integers(1, 4 * GIB))
def test_faster_tier_never_loses_at_equal_load(ram_bytes: int, disk_bytes: int) -> None:
    """The same bytes held in RAM on one worker and on disk on another: RAM wins."""
    n = min(ram_bytes, disk_bytes)
    req = ReplicaRequest("f", "cpu", model_digest=MODEL, memory_bytes=4 * GIB)
    p = place(req, [worker("z-ram", ("ram", n)), worker("a-disk", ("disk", n))])
    assert p.worker_id == "z-ram"
