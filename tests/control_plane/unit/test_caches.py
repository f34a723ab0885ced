"""The control plane's per-process caches: verified keys (``keys.PrincipalCache``)
and deployed versions (``functions.VersionCache``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, delete
from sqlalchemy.orm import Session
from sqlalchemy.pool import StaticPool

from control_plane.db.models import Base, Function, FunctionVersion
from control_plane.services import functions
from control_plane.services.keys import MAX_CACHED_PRINCIPALS, Principal, PrincipalCache
from control_plane.spec import FunctionSpec

BUNDLE = "blake3:" + "0" * 64


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def who(key_id: str) -> Principal:
    return Principal(key_id, frozenset({"invoke"}))


def test_a_verified_key_is_trusted_for_its_ttl_then_read_again() -> None:
    clock = FakeClock()
    cache = PrincipalCache(clock, ttl_s=2.0)
    cache.put("thaw_a_secret", who("a"))
    assert cache.get("thaw_a_secret") == who("a")
    assert cache.get("thaw_a_other") is None  # another secret of the same id
    assert cache.get(None) is None
    clock.now += 2.0
    assert cache.get("thaw_a_secret") is None


def test_a_revoked_key_is_forgotten_at_once() -> None:
    cache = PrincipalCache(FakeClock(), ttl_s=60.0)
    cache.put("thaw_a_1", who("a"))
    cache.put("thaw_b_1", who("b"))
    cache.drop("a")
    assert cache.get("thaw_a_1") is None
    assert cache.get("thaw_b_1") == who("b")


def test_a_zero_ttl_keeps_nothing_and_the_cache_stays_bounded() -> None:
    off = PrincipalCache(FakeClock(), ttl_s=0.0)
    off.put("thaw_a_1", who("a"))
    assert off.get("thaw_a_1") is None
    cache = PrincipalCache(FakeClock(), ttl_s=60.0)
    for i in range(MAX_CACHED_PRINCIPALS + 5):
        cache.put(f"thaw_k{i}_s", who(f"k{i}"))
    assert len(cache._by_token) <= MAX_CACHED_PRINCIPALS
    assert cache.get(f"thaw_k{MAX_CACHED_PRINCIPALS + 4}_s") is not None  # the newest stays


@pytest.fixture
def session() -> Iterator[Session]:
    engine = create_engine("sqlite://", poolclass=StaticPool)
    Base.metadata.create_all(engine)
    with Session(engine) as s:
        yield s


def deploy(session: Session, spec: FunctionSpec, now: float) -> Function:
    """A function with ``spec`` as its version 1 (the rows ``functions.deploy`` writes)."""
    fn = Function(name=spec.name, created_at=now, active_version=1)
    session.add(fn)
    session.flush()
    session.add(
        FunctionVersion(
            function_id=fn.id,
            version=1,
            spec_json=spec.model_dump_json(),
            model_digest=None,
            adapters_json="[]",
            created_at=now,
        )
    )
    session.flush()
    return fn


def test_a_version_is_read_once_and_a_redeployed_function_is_read_anew(
    session: Session,
) -> None:
    cache = functions.VersionCache()
    first = FunctionSpec(name="f", bundle=BUNDLE, entry="app:A", timeout_s=5)
    fn = deploy(session, first, now=1.0)
    key = functions.FunctionKey(fn.id, fn.created_at, fn.name)
    v1 = cache.version_of(session, key, 1)
    assert v1.spec.timeout_s == 5
    assert cache.version_of(session, key, 1) is v1  # not read again
    # Deleted and deployed again: the same name (and on SQLite maybe the same id),
    # another function.
    session.execute(delete(FunctionVersion).where(FunctionVersion.function_id == fn.id))
    session.execute(delete(Function).where(Function.id == fn.id))
    second = FunctionSpec(name="f", bundle=BUNDLE, entry="app:A", timeout_s=9)
    fn2 = deploy(session, second, now=2.0)
    assert fn2.id == fn.id  # SQLite gave the id again: the cache must not mistake it
    key2 = functions.FunctionKey(fn2.id, fn2.created_at, fn2.name)
    assert cache.version_of(session, key2, 1).spec.timeout_s == 9
