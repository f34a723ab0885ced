"""Cache-aware routing: session affinity, prefix routing by rendezvous hashing, the
load bound, and the adapter preference. Pure functions; no I/O."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from control_plane.services.router import (
    CallRoute,
    ReplicaView,
    affinity_bound,
    load_bound,
    prefix_key,
    rendezvous_order,
    route,
)
from control_plane.spec import FunctionSpec


def rep(rid: str, **kw: object) -> ReplicaView:
    base: dict[str, object] = dict(id=rid, state="ready", version=1, outstanding=0)
    base.update(kw)
    return ReplicaView(**base)  # type: ignore[arg-type]


def call(**kw: object) -> CallRoute:
    base: dict[str, object] = dict(version=1, adapter=None, max_outstanding=8)
    base.update(kw)
    return CallRoute(**base)  # type: ignore[arg-type]


# --- session affinity ----------------------------------------------------------


def test_a_session_goes_back_to_its_replica_even_when_another_is_less_busy() -> None:
    rs = [rep("a"), rep("b", outstanding=1)]
    chosen = route(rs, call(session_replica="b"))
    assert chosen is not None and (chosen.replica.id, chosen.policy) == ("b", "session")


def test_a_session_falls_back_when_its_replica_is_over_the_affinity_bound() -> None:
    # Capacity 8: half is 4; load bound ceil(1.25 * (4 + 0 + 1) / 2) = 4: b at 4 is over.
    rs = [rep("a"), rep("b", outstanding=4)]
    chosen = route(rs, call(session_replica="b"))
    assert chosen is not None and (chosen.replica.id, chosen.policy) == ("a", "least_outstanding")


def test_under_light_load_a_session_stays_although_its_replica_is_busier() -> None:
    # The load bound alone (ceil(1.25 * 4 / 2) = 3) would move it at 3; half of 8 is 4.
    rs = [rep("a"), rep("b", outstanding=3)]
    chosen = route(rs, call(session_replica="b"))
    assert chosen is not None and (chosen.replica.id, chosen.policy) == ("b", "session")


def test_a_session_falls_back_when_its_replica_is_full_draining_or_gone() -> None:
    for rs in (
        [rep("a"), rep("b", outstanding=2)],  # full: max_outstanding 2
        [rep("a"), rep("b", state="draining")],
        [rep("a"), rep("b", version=0)],  # an older version
        [rep("a")],
    ):
        chosen = route(rs, call(session_replica="b", max_outstanding=2))
        assert chosen is not None and chosen.replica.id == "a" and chosen.policy != "session"


def test_a_session_beats_the_prefix_and_the_adapter() -> None:
    rs = [rep("a", adapters=frozenset({"fr"})), rep("b"), rep("c")]
    key = "the same long system prompt"
    prefix_first = rendezvous_order(key, ["a", "b", "c"])[0]
    session = next(r for r in ("b", "c") if r != prefix_first)
    chosen = route(rs, call(session_replica=session, prefix_key=key, adapter="fr"))
    assert chosen is not None and chosen.replica.id == session


# --- prefix routing ------------------------------------------------------------


def test_prefix_key_takes_the_prompts_first_characters() -> None:
    assert prefix_key({"prompt": "abcdef", "n": 1}, "prompt", 4) == "abcd"
    assert prefix_key({"prompt": "ab"}, "prompt", 4) == "ab"
    assert prefix_key({"messages": [{"role": "system"}]}, "messages", 9) == '[{"role":'
    assert prefix_key({"other": "x"}, "prompt", 4) is None
    assert prefix_key("not a dict", "prompt", 4) is None
    assert prefix_key({"prompt": None}, "prompt", 4) is None


def test_calls_sharing_a_prefix_go_to_the_same_replica_whatever_their_tails() -> None:
    rs = [rep("a"), rep("b"), rep("c"), rep("d")]
    system = "You are a helpful assistant. " * 20
    keys = [prefix_key({"prompt": system + tail}, "prompt", 256) for tail in ("hi", "yo", "?")]
    chosen = {route(rs, call(prefix_key=k)) for k in keys}
    assert len(chosen) == 1
    [only] = chosen
    assert only is not None and only.policy == "prefix"


def test_different_prefixes_spread_over_the_replicas() -> None:
    ids = ["a", "b", "c", "d"]
    firsts = {rendezvous_order(f"prompt {i}", ids)[0] for i in range(64)}
    assert firsts == set(ids)


def test_a_prefix_spills_to_its_next_replica_over_the_bound() -> None:
    ids = ["a", "b", "c"]
    first, second, _ = rendezvous_order("k", ids)
    # Bound: max(ceil(1.25 * 5 / 3), 8 / 2) = 4; the prefix's first replica has 4.
    rs = [rep(r, outstanding=4 if r == first else (1 if r == second else 0)) for r in ids]
    chosen = route(rs, call(prefix_key="k"))
    # Its second replica, though the third is less busy: the spill is consistent too.
    assert chosen is not None and (chosen.replica.id, chosen.policy, chosen.rank) == (
        second,
        "prefix",
        1,
    )


@given(
    st.lists(st.integers(0, 8), min_size=1, max_size=6),
    st.integers(1, 8),
    st.text(min_size=1, max_size=8),
)
def test_a_prefix_always_finds_a_replica_with_room_first_in_its_order(
    loads: list[int], capacity: int, key: str
) -> None:
    rs = [rep(f"r{i}", outstanding=n) for i, n in enumerate(loads)]
    chosen = route(rs, call(prefix_key=key, max_outstanding=capacity))
    with_room = [r for r in rs if r.outstanding < capacity]
    assert (chosen is None) == (not with_room)
    if chosen is not None:
        # The least loaded replica is always under the bound: the walk never falls through.
        order = rendezvous_order(key, [r.id for r in rs])
        assert chosen.policy == "prefix" and order[chosen.rank] == chosen.replica.id
        bound = affinity_bound(loads, capacity)
        skipped = {r.id: r for r in rs if r.id in order[: chosen.rank]}
        assert all(r.outstanding >= min(bound, capacity) for r in skipped.values())


@given(
    st.text(min_size=1, max_size=20),
    st.sets(st.text("abcdef", min_size=1, max_size=3), min_size=2, max_size=8),
    st.data(),
)
def test_removing_a_replica_moves_only_the_keys_it_had(
    key: str, ids: set[str], data: st.DataObject
) -> None:
    order = rendezvous_order(key, sorted(ids))
    gone = data.draw(st.sampled_from(sorted(ids)))
    after = rendezvous_order(key, sorted(ids - {gone}))
    assert after == [r for r in order if r != gone]


# --- load bound and defaults ---------------------------------------------------


def test_affinity_bound_is_the_load_bound_or_half_the_capacity() -> None:
    assert affinity_bound([0, 0], max_outstanding=1) == 1
    assert affinity_bound([0, 0], max_outstanding=8) == 4
    assert affinity_bound([8, 8, 8, 8], max_outstanding=16) == 11  # ceil(1.25 * 33 / 4)


def test_load_bound_is_a_quarter_over_the_mean_with_the_new_call() -> None:
    assert load_bound([]) == 1
    assert load_bound([0, 0]) == 1
    assert load_bound([1, 0]) == 2
    assert load_bound([2, 0]) == 2  # (2 + 1) / 2 * 1.25 = 1.875
    assert load_bound([4, 4, 4, 4]) == 6  # ceil(17 / 4 * 1.25) = ceil(5.31)


def test_default_is_least_outstanding_preferring_adapter_holders() -> None:
    rs = [rep("a", outstanding=1), rep("b", outstanding=2, adapters=frozenset({"fr"})), rep("c")]
    plain = route(rs, call())
    assert plain is not None and (plain.replica.id, plain.policy) == ("c", "least_outstanding")
    fr = route(rs, call(adapter="fr"))
    assert fr is not None and fr.replica.id == "b"
    assert route(rs, call(adapter="de")) == plain  # nobody holds it: any replica loads it


def test_none_when_no_replica_has_room() -> None:
    rs = [rep("a", outstanding=2), rep("b", state="starting")]
    assert route(rs, call(max_outstanding=2, session_replica="a", prefix_key="k")) is None


# --- the spec ------------------------------------------------------------------


def test_a_spec_declares_its_prompt_field_and_prefix_length() -> None:
    base = {"name": "chat", "bundle": "blake3:" + "0" * 64, "entry": "app:Chat"}
    spec = FunctionSpec.model_validate({**base, "routing": {"prompt_field": "prompt"}})
    assert spec.routing is not None and spec.routing.prefix_chars == 256
    assert FunctionSpec.model_validate(base).routing is None
    for bad in ({}, {"prompt_field": ""}, {"prompt_field": "p", "prefix_chars": 0}):
        with pytest.raises(ValidationError):
            FunctionSpec.model_validate({**base, "routing": bad})
