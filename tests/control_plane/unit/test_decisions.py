"""The pure decisions: placement, autoscaling, routing. No I/O, no sleeping."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from control_plane.errors import NoCapacityError
from control_plane.services.autoscaler import ScaleState, desired_replicas
from control_plane.services.router import CallRoute, ReplicaView, choose
from control_plane.services.scheduler import (
    ReplicaRequest,
    WorkerSnapshot,
    estimated_start_s,
    place,
)


def worker(wid: str, **kw: object) -> WorkerSnapshot:
    base: dict[str, object] = dict(
        id=wid,
        healthy=True,
        device_kinds=frozenset({"cpu"}),
        free_memory_bytes=0,
        replicas=0,
        max_replicas=4,
    )
    base.update(kw)
    return WorkerSnapshot(**base)  # type: ignore[arg-type]


# --- scheduler -----------------------------------------------------------------


def test_place_prefers_worker_with_model_cached_over_less_loaded() -> None:
    req = ReplicaRequest("f", "any", model_digest="blake3:aa", memory_bytes=2 << 30)
    ws = [worker("a"), worker("b", replicas=2, cached_manifests=frozenset({"blake3:aa"}))]
    p = place(req, ws)
    assert (p.worker_id, p.model_cached) == ("b", True)


def test_place_least_loaded_when_nothing_cached() -> None:
    ws = [worker("a", replicas=2), worker("b", replicas=1), worker("c", replicas=3)]
    assert place(ReplicaRequest("f", "cpu"), ws).worker_id == "b"


def test_place_skips_unhealthy_full_and_short_on_memory() -> None:
    ws = [
        worker("sick", healthy=False),
        worker("full", replicas=4),
        worker("small", free_memory_bytes=5),
        worker("ok", replicas=3, free_memory_bytes=100),
    ]
    assert place(ReplicaRequest("f", "cpu", memory_bytes=50), ws).worker_id == "ok"


def test_place_cuda_needs_a_cuda_worker_and_any_resolves() -> None:
    gpu = worker("gpu", device_kinds=frozenset({"cpu", "cuda"}), replicas=3)
    assert place(ReplicaRequest("f", "cuda"), [worker("cpu"), gpu]).device == "cuda"
    assert place(ReplicaRequest("f", "any"), [gpu]).device == "cuda"
    assert place(ReplicaRequest("f", "any"), [worker("cpu")]).device == "cpu"
    with pytest.raises(NoCapacityError, match="CUDA"):
        place(ReplicaRequest("f", "cuda"), [worker("cpu")])


def test_place_without_workers_says_how_to_start_one() -> None:
    with pytest.raises(NoCapacityError, match="thaw worker"):
        place(ReplicaRequest("f", "cpu"), [])


workers_st = st.lists(
    st.builds(
        WorkerSnapshot,
        id=st.text("abcdef", min_size=1, max_size=4),
        healthy=st.booleans(),
        device_kinds=st.sampled_from([frozenset({"cpu"}), frozenset({"cpu", "cuda"})]),
        free_memory_bytes=st.integers(0, 1000),
        replicas=st.integers(0, 5),
        max_replicas=st.integers(0, 5),
        outstanding_calls=st.integers(0, 5),
        cached_manifests=st.sampled_from([frozenset(), frozenset({"m"})]),
    ),
    max_size=6,
)


@given(workers_st, st.sampled_from(["cpu", "cuda", "any"]), st.integers(0, 1000))
def test_place_only_picks_fitting_workers_with_the_soonest_start(
    ws: list[WorkerSnapshot], device: str, need: int
) -> None:
    req = ReplicaRequest("f", device, model_digest="m", memory_bytes=need)
    try:
        p = place(req, ws)
    except NoCapacityError:
        return
    chosen = [w for w in ws if w.id == p.worker_id]
    assert any(w.healthy and w.replicas < w.max_replicas for w in chosen)
    if device == "cuda":
        assert p.device == "cuda"
    fitting = [
        w
        for w in ws
        if w.healthy
        and w.replicas < w.max_replicas
        and (w.free_memory_bytes == 0 or w.free_memory_bytes >= need)
        and (device != "cuda" or "cuda" in w.device_kinds)
    ]
    assert p.estimated_start_s == min(estimated_start_s(req, w) for w in fitting)


# --- autoscaler ----------------------------------------------------------------


def scale(**kw: object) -> ScaleState:
    base: dict[str, object] = dict(
        min_replicas=0,
        max_replicas=10,
        idle_timeout_s=60.0,
        target_concurrency=2,
        in_flight=0,
        queued=0,
        current_replicas=0,
        last_call_at=None,
    )
    base.update(kw)
    return ScaleState(**base)  # type: ignore[arg-type]


def test_scale_up_by_load_over_target_concurrency_ceil() -> None:
    assert desired_replicas(scale(in_flight=3, queued=2), now=0) == 3


def test_scale_to_zero_only_after_idle_timeout() -> None:
    s = scale(current_replicas=2, last_call_at=100.0)
    assert desired_replicas(s, now=159.9) == 2
    assert desired_replicas(s, now=160.0) == 0


def test_scale_clamped_to_min_and_max() -> None:
    assert desired_replicas(scale(min_replicas=1, last_call_at=None), now=1e9) == 1
    assert desired_replicas(scale(max_replicas=2, queued=100), now=0) == 2


@given(
    st.integers(0, 3),
    st.integers(0, 10),
    st.integers(1, 8),
    st.integers(0, 50),
    st.integers(0, 50),
    st.integers(0, 10),
    st.one_of(st.none(), st.floats(0, 1000)),
    st.floats(0, 2000),
)
def test_scale_properties(
    lo: int,
    span: int,
    target: int,
    in_flight: int,
    queued: int,
    current: int,
    last: float | None,
    now: float,
) -> None:
    s = scale(
        min_replicas=lo,
        max_replicas=lo + span,
        target_concurrency=target,
        in_flight=in_flight,
        queued=queued,
        current_replicas=current,
        last_call_at=last,
    )
    n = desired_replicas(s, now)
    assert lo <= n <= lo + span
    load = in_flight + queued
    if load:
        # Enough replicas for the load, unless capped by max.
        assert n * target >= load or n == lo + span
        assert n == lo or (n - 1) * target < load


# --- router --------------------------------------------------------------------


def rep(rid: str, **kw: object) -> ReplicaView:
    base: dict[str, object] = dict(id=rid, state="ready", version=1, outstanding=0)
    base.update(kw)
    return ReplicaView(**base)  # type: ignore[arg-type]


def test_router_fewest_outstanding_ready_same_version() -> None:
    rs = [
        rep("a", outstanding=2),
        rep("b", outstanding=1),
        rep("c", state="starting"),
        rep("d", version=0),
    ]
    chosen = choose(rs, CallRoute(version=1, adapter=None, max_outstanding=4))
    assert chosen is not None and chosen.id == "b"


def test_router_prefers_replica_holding_the_adapter() -> None:
    rs = [rep("a"), rep("b", outstanding=2, adapters=frozenset({"fr"}))]
    chosen = choose(rs, CallRoute(version=1, adapter="fr", max_outstanding=4))
    assert chosen is not None and chosen.id == "b"


def test_router_none_when_all_full_or_not_ready() -> None:
    rs = [rep("a", outstanding=2), rep("b", state="starting")]
    assert choose(rs, CallRoute(version=1, adapter=None, max_outstanding=2)) is None


@given(
    st.lists(
        st.builds(
            ReplicaView,
            id=st.text("xyz", min_size=1, max_size=3),
            state=st.sampled_from(["starting", "ready", "draining"]),
            version=st.integers(1, 2),
            outstanding=st.integers(0, 4),
            adapters=st.sampled_from([frozenset(), frozenset({"a"})]),
        ),
        max_size=6,
    ),
    st.sampled_from([None, "a"]),
)
def test_router_properties(rs: list[ReplicaView], adapter: str | None) -> None:
    route = CallRoute(version=1, adapter=adapter, max_outstanding=3)
    chosen = choose(rs, route)
    eligible = [r for r in rs if r.state == "ready" and r.version == 1 and r.outstanding < 3]
    assert (chosen is None) == (not eligible)
    if chosen is not None:
        if adapter and any(adapter in r.adapters for r in eligible):
            assert adapter in chosen.adapters
        else:
            assert chosen.outstanding == min(r.outstanding for r in eligible)
