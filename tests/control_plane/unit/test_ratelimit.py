"""The token-bucket policy and the per-process limiter, with a fake clock (no sleeping)."""

from __future__ import annotations

import pytest

from control_plane.errors import BadRequestError, RateLimitedError
from control_plane.services.ratelimit import (
    MAX_FUNCTION_LIMITS,
    Bucket,
    Limit,
    RateLimiter,
    decide,
    key_limit,
    retry_after_header,
)


def test_a_new_bucket_allows_burst_calls_then_refuses_with_the_wait() -> None:
    limit = Limit(rate_per_s=2.0, burst=3)
    bucket: Bucket | None = None
    for _ in range(3):
        decision, bucket = decide(bucket, limit, now=100.0)
        assert decision.allowed
    decision, bucket = decide(bucket, limit, now=100.0)
    assert not decision.allowed
    assert decision.retry_after_s == pytest.approx(0.5)


def test_tokens_refill_at_the_rate_and_cap_at_burst() -> None:
    limit = Limit(rate_per_s=2.0, burst=3)
    _, bucket = decide(Bucket(0.0, 10.0), limit, now=10.25)
    assert bucket.tokens == pytest.approx(0.5)
    decision, _ = decide(bucket, limit, now=10.25)
    assert not decision.allowed and decision.retry_after_s == pytest.approx(0.25)
    decision, bucket = decide(Bucket(0.0, 10.0), limit, now=1000.0)
    assert decision.allowed and bucket.tokens == pytest.approx(2.0)  # capped at 3, then one taken


def test_a_clock_going_back_does_not_mint_tokens() -> None:
    decision, bucket = decide(Bucket(0.0, 50.0), Limit(1.0, 1), now=40.0)
    assert not decision.allowed and bucket.tokens == 0.0


def test_limit_defaults_burst_to_one_second_of_calls() -> None:
    assert Limit.of(None, None) is None
    assert Limit.of(0.2, None) == Limit(0.2, 1)
    assert Limit.of(7.5, None) == Limit(7.5, 8)
    assert Limit.of(5.0, 20) == Limit(5.0, 20)
    with pytest.raises(BadRequestError, match="--rate"):
        key_limit(None, 4)


def test_retry_after_is_whole_seconds_rounded_up() -> None:
    assert retry_after_header(0.01) == "1"
    assert retry_after_header(1.2) == "2"
    assert retry_after_header(float("inf")) == "3600"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_limiter_charges_key_and_function_and_names_the_one_over() -> None:
    clock = FakeClock()
    limits = {"f": Limit(1.0, 2)}
    limiter = RateLimiter(clock, limits.get)
    limiter.check("k1", None, "f")
    limiter.check("k2", None, "f")
    with pytest.raises(RateLimitedError, match="function 'f' is over its rate limit") as info:
        limiter.check("k3", None, "f")
    assert info.value.retry_after_s == pytest.approx(1.0)
    limiter.check("k3", Limit(1.0, 1), "g")  # other function: no limit; the key has one
    with pytest.raises(RateLimitedError, match=r"API key k3 .* --rate"):
        limiter.check("k3", Limit(1.0, 1), "g")
    clock.now += 1.0
    limiter.check("k3", Limit(1.0, 1), "f")


def test_a_refused_call_takes_no_token_from_the_other_bucket() -> None:
    clock = FakeClock()
    limiter = RateLimiter(clock, {"f": Limit(1.0, 1)}.get)
    limiter.check("k", Limit(1.0, 2), "f")  # key 2 -> 1, function 1 -> 0
    with pytest.raises(RateLimitedError, match="function"):
        limiter.check("k", Limit(1.0, 2), "f")
    limiter.check("k", Limit(1.0, 2), "other")  # the key still had its second token


def test_the_limiter_knows_a_function_only_while_its_limit_is_fresh() -> None:
    clock = FakeClock()
    reads: list[str] = []

    def read(name: str) -> Limit | None:
        reads.append(name)
        return None

    limiter = RateLimiter(clock, read)
    assert not limiter.knows("f")  # the invoke route reads it off the event loop
    limiter.check("k", None, "f")
    assert limiter.knows("f") and reads == ["f"]
    clock.now += 3600
    assert not limiter.knows("f")


def test_learning_a_limit_charges_nothing_and_names_from_requests_are_kept_bounded() -> None:
    clock = FakeClock()
    limiter = RateLimiter(clock, {"f": Limit(1.0, 1)}.get)
    limiter.learn("f")  # read before a transaction, charged within it
    assert limiter.knows("f")
    limiter.check("k", None, "f")  # the one token is still there
    for n in range(MAX_FUNCTION_LIMITS + 1):  # any name a caller sends
        limiter.learn(f"nosuch-{n}")
    assert len(limiter._limits) <= MAX_FUNCTION_LIMITS
