"""Rate limits on invokes: a token bucket per API key and per function.

A bucket holds at most ``burst`` tokens and refills at ``rate_per_s``; a call
takes one token, or is refused with the seconds until one is there (the
``Retry-After`` of the 429). :func:`decide` is the whole policy: a pure
function of (bucket, limit, now), tested with a fake clock.

Where the state lives (``services.ratelimit_zone``): in the memory of the
process, or, for the processes of one ``thaw server --processes N``, in a
table they share. Behind a load balancer with N separate servers a client can
get up to N times the limit, and a restart refills every bucket; the limit
protects workers from floods, it is not billing. The check runs before a call
is recorded or scheduled, so a refused call never starts a replica.

Limits come from the key (``thaw keys create --rate 5 --burst 10``) and from
the function's spec (``[limits] calls_per_s = 5``, ``burst = 10``); a call
must pass both. A function's limits are re-read at most every
``FUNCTION_LIMITS_TTL_S`` seconds, so a redeploy takes effect within that.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass

from control_plane.clock import Clock
from control_plane.errors import BadRequestError, RateLimitedError
from control_plane.services.ratelimit_zone import Buckets, MemoryBuckets

FUNCTION_LIMITS_TTL_S = 2.0
# Function limits kept at most: names come from requests (any name a caller sends).
MAX_FUNCTION_LIMITS = 4096


@dataclass(frozen=True)
class Limit:
    """``rate_per_s`` tokens a second, at most ``burst`` saved up (at least 1)."""

    rate_per_s: float
    burst: int

    @classmethod
    def of(cls, rate_per_s: float | None, burst: int | None) -> Limit | None:
        """The limit a key or spec sets; None when it sets no rate. Burst defaults to
        one second's worth of calls (at least 1)."""
        if rate_per_s is None:
            return None
        return cls(rate_per_s, burst if burst is not None else max(1, math.ceil(rate_per_s)))


@dataclass(frozen=True)
class Bucket:
    tokens: float
    updated_at: float


@dataclass(frozen=True)
class Decision:
    allowed: bool
    retry_after_s: float  # 0 when allowed


def decide(bucket: Bucket | None, limit: Limit, now: float) -> tuple[Decision, Bucket]:
    """Take one token from ``bucket`` (None: a new, full one). Returns the decision and
    the bucket after it. Pure."""
    if bucket is None:
        bucket = Bucket(float(limit.burst), now)
    elapsed_s = max(0.0, now - bucket.updated_at)
    tokens = min(float(limit.burst), bucket.tokens + elapsed_s * limit.rate_per_s)
    if tokens >= 1.0:
        return Decision(True, 0.0), Bucket(tokens - 1.0, now)
    wait_s = (1.0 - tokens) / limit.rate_per_s if limit.rate_per_s > 0 else math.inf
    return Decision(False, wait_s), Bucket(tokens, now)


def key_limit(rate_per_s: float | None, burst: int | None) -> Limit | None:
    """A key's limit as asked for at creation; a burst without a rate is refused."""
    if burst is not None and rate_per_s is None:
        raise BadRequestError("a burst needs a rate: pass --rate CALLS_PER_S with --burst")
    return Limit.of(rate_per_s, burst)


def retry_after_header(retry_after_s: float) -> str:
    """Whole seconds, rounded up, at least 1 (``Retry-After`` takes integers)."""
    if math.isinf(retry_after_s):
        return "3600"
    return str(max(1, math.ceil(retry_after_s)))


class RateLimiter:
    """Charges the buckets (``buckets``: this process's own by default). Thread-safe."""

    def __init__(
        self,
        clock: Clock,
        function_limit: Callable[[str], Limit | None] | None = None,
        buckets: Buckets | None = None,
    ) -> None:
        self._clock = clock
        self._function_limit = function_limit or (lambda _: None)
        self._buckets = buckets if buckets is not None else MemoryBuckets()
        self._limits: dict[str, tuple[float, Limit | None]] = {}
        self._lock = threading.Lock()

    def check(self, key_id: str, key_limit: Limit | None, function: str) -> None:
        """Take a token for ``key_id`` and one for ``function``; raise
        ``RateLimitedError`` (nothing taken) when either bucket is empty."""
        fn_limit = self._cached_function_limit(function)
        now = self._clock()
        checks = [
            (("key", key_id), key_limit, f"API key {key_id}", "ask for a key with a higher --rate"),
            (("function", function), fn_limit, f"function {function!r}", "raise [limits]"),
        ]
        if all(limit is None for _, limit, _, _ in checks):
            return
        with self._buckets.charging() as table:
            taken: dict[tuple[str, str], Bucket] = {}
            for slot, limit, who, remedy in checks:
                if limit is None:
                    continue
                saved = table.get(slot)
                bucket = Bucket(*saved) if saved is not None else None
                decision, after = decide(bucket, limit, now)
                if not decision.allowed:
                    raise RateLimitedError(
                        f"{who} is over its rate limit of {limit.rate_per_s:g} calls/s "
                        f"(burst {limit.burst}); retry after {decision.retry_after_s:.2f} s "
                        f"or {remedy}",
                        decision.retry_after_s,
                    )
                taken[slot] = after
            for slot, after in taken.items():
                table[slot] = (after.tokens, after.updated_at)

    def close(self) -> None:
        """Let go of the buckets (a shared table's mapping); no charge after this."""
        self._buckets.close()

    def knows(self, function: str) -> bool:
        """Whether ``check`` can judge ``function`` without reading its limit (no I/O)."""
        with self._lock:
            cached = self._limits.get(function)
        return cached is not None and self._clock() - cached[0] < FUNCTION_LIMITS_TTL_S

    def learn(self, function: str) -> None:
        """Read ``function``'s limit now unless it is fresh (I/O), so that ``check`` soon
        after needs none."""
        self._cached_function_limit(function)

    def _cached_function_limit(self, function: str) -> Limit | None:
        now = self._clock()
        with self._lock:
            cached = self._limits.get(function)
        if cached is not None and now - cached[0] < FUNCTION_LIMITS_TTL_S:
            return cached[1]
        limit = self._function_limit(function)
        with self._lock:
            if len(self._limits) >= MAX_FUNCTION_LIMITS:
                self._limits.clear()  # read again as needed: 2 s old at most anyway
            self._limits[function] = (now, limit)
        return limit
