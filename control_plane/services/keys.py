"""API keys: created, looked up by id, verified in constant time, revoked.

A key reads ``thaw_<id>_<secret>``: ``id`` (12 hex) is stored in clear for
lookup, ``secret`` (32 random bytes, urlsafe base64) only as its SHA-256.
A key holds scopes (admin, deploy, invoke, worker) and may be limited to one
function. ``admin`` implies every other scope. A key may carry a rate limit on
its invokes (``rate_per_s``, ``rate_burst``; see ``services.ratelimit``).

A control-plane process keeps the principals of tokens it verified for a
moment (``PrincipalCache``), so an invoke does not read its key every time. A
key revoked through this process stops working at once; one revoked through
another process stops working here within the cache's TTL.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from control_plane.clock import Clock
from control_plane.db.models import ApiKey
from control_plane.errors import (
    BadRequestError,
    ForbiddenError,
    NotFoundError,
    UnauthorizedError,
)
from control_plane.services.ratelimit import Limit

SCOPES = ("admin", "deploy", "invoke", "worker")
KEY_PREFIX = "thaw_"
MAX_CACHED_PRINCIPALS = 10_000


@dataclass(frozen=True)
class Principal:
    """Who is calling: the key's id, scopes and optional function limit."""

    key_id: str
    scopes: frozenset[str]
    function: str | None = None
    rate: Limit | None = None

    def require(self, scope: str, function: str | None = None) -> None:
        """Raise ``ForbiddenError`` unless this key may use ``scope`` (on ``function``)."""
        if "admin" not in self.scopes and scope not in self.scopes:
            raise ForbiddenError(
                f"API key {self.key_id} lacks scope {scope!r} (it has "
                f"{', '.join(sorted(self.scopes))}); "
                f"create one with `thaw keys create --scope {scope}`"
            )
        if self.function is not None and function is not None and function != self.function:
            raise ForbiddenError(
                f"API key {self.key_id} is limited to function {self.function!r}, not {function!r}"
            )


@dataclass(frozen=True)
class KeyInfo:
    id: str
    name: str
    scopes: list[str]
    function: str | None
    created_at: float
    revoked_at: float | None
    rate_per_s: float | None = None
    rate_burst: int | None = None


def _sha256(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _check_scopes(scopes: Iterable[str]) -> list[str]:
    out = sorted(set(scopes))
    bad = [s for s in out if s not in SCOPES]
    if bad or not out:
        raise BadRequestError(f"unknown or no scopes {bad}; choose from {', '.join(SCOPES)}")
    return out


def create_key(
    session: Session,
    now: float,
    scopes: Iterable[str],
    name: str = "",
    function: str | None = None,
    rate: Limit | None = None,
) -> tuple[str, KeyInfo]:
    """Store a new key; return (the full token, shown once; its info)."""
    key_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    row = ApiKey(
        id=key_id,
        name=name,
        secret_sha256=_sha256(secret),
        scopes=",".join(_check_scopes(scopes)),
        function=function,
        created_at=now,
        rate_per_s=rate.rate_per_s if rate else None,
        rate_burst=rate.burst if rate else None,
    )
    session.add(row)
    session.flush()
    return f"{KEY_PREFIX}{key_id}_{secret}", _info(row)


def authenticate(session: Session, token: str | None) -> Principal:
    """The principal a bearer token names. Raises ``UnauthorizedError``."""
    if not token:
        raise UnauthorizedError("missing API key: send `Authorization: Bearer thaw_...`")
    key_id, secret = _split(token)
    row = session.get(ApiKey, key_id)
    # Compare even when the id is unknown, so timing does not reveal which ids exist.
    expected = row.secret_sha256 if row is not None else "0" * 64
    ok = hmac.compare_digest(expected, _sha256(secret))
    if row is None or not ok or row.revoked_at is not None:
        raise UnauthorizedError(
            "invalid or revoked API key; check THAW_API_KEY, or ask an admin for a new key "
            "(`thaw keys create`)"
        )
    rate = Limit.of(row.rate_per_s, row.rate_burst)
    return Principal(row.id, frozenset(row.scopes.split(",")), row.function, rate)


class PrincipalCache:
    """Principals of tokens verified within the last ``ttl_s`` (0: none are kept),
    by the SHA-256 of the token: the cache holds no secret."""

    def __init__(self, clock: Clock, ttl_s: float) -> None:
        self._clock = clock
        self._ttl_s = ttl_s
        self._by_token: dict[bytes, tuple[float, Principal]] = {}

    def get(self, token: str | None) -> Principal | None:
        if not token or self._ttl_s <= 0:
            return None
        hit = self._by_token.get(hashlib.sha256(token.encode()).digest())
        if hit is None or hit[0] <= self._clock():
            return None
        return hit[1]

    def put(self, token: str, who: Principal) -> None:
        if self._ttl_s <= 0:
            return
        now = self._clock()
        if len(self._by_token) >= MAX_CACHED_PRINCIPALS:  # drop the expired, else all
            live = {k: v for k, v in self._by_token.items() if v[0] > now}
            self._by_token = live if len(live) < MAX_CACHED_PRINCIPALS else {}
        self._by_token[hashlib.sha256(token.encode()).digest()] = (now + self._ttl_s, who)

    def drop(self, key_id: str) -> None:
        """Forget every token of ``key_id`` (it was just revoked)."""
        for k, (_, who) in list(self._by_token.items()):
            if who.key_id == key_id:
                self._by_token.pop(k, None)


def _split(token: str) -> tuple[str, str]:
    if not token.startswith(KEY_PREFIX):
        raise UnauthorizedError("malformed API key: it should start with 'thaw_'")
    key_id, sep, secret = token[len(KEY_PREFIX) :].partition("_")
    if not sep or not key_id or not secret:
        raise UnauthorizedError("malformed API key: expected thaw_<id>_<secret>")
    return key_id, secret


def list_keys(session: Session) -> list[KeyInfo]:
    rows = session.scalars(select(ApiKey).order_by(ApiKey.created_at)).all()
    return [_info(r) for r in rows]


def revoke_key(session: Session, key_id: str, now: float) -> KeyInfo:
    row = session.get(ApiKey, key_id)
    if row is None:
        raise NotFoundError(f"no API key {key_id!r}; list them with `thaw keys ls`")
    if row.revoked_at is None:
        row.revoked_at = now
    return _info(row)


def bootstrap_admin(session: Session, now: float) -> str | None:
    """On an installation with no keys, create the first admin key and return its token."""
    if session.scalars(select(ApiKey.id).limit(1)).first() is not None:
        return None
    token, _ = create_key(session, now, ["admin"], name="bootstrap admin")
    return token


def _info(row: ApiKey) -> KeyInfo:
    return KeyInfo(
        row.id,
        row.name,
        row.scopes.split(","),
        row.function,
        row.created_at,
        row.revoked_at,
        row.rate_per_s,
        row.rate_burst,
    )
