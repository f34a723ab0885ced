"""The one place errors become HTTP statuses."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sqlalchemy.exc import OperationalError

from control_plane.api.timing import call_headers
from control_plane.errors import (
    BadRequestError,
    ConflictError,
    ControlPlaneError,
    DeadlineExceededError,
    ForbiddenError,
    NoCapacityError,
    NotFoundError,
    PayloadTooLargeError,
    RateLimitedError,
    UnauthorizedError,
    UnprocessableError,
    UnsupportedMediaTypeError,
)
from control_plane.protocol import ProtocolVersionError
from control_plane.services.ratelimit import retry_after_header
from snapshotter.errors import InvalidReferenceError, SnapshotterError
from snapshotter.errors import NotFoundError as StoreNotFound

STATUS_BY_ERROR: list[tuple[type[Exception], int]] = [
    (BadRequestError, 400),
    (UnauthorizedError, 401),
    (ForbiddenError, 403),
    (NotFoundError, 404),
    (ConflictError, 409),
    (PayloadTooLargeError, 413),
    (UnprocessableError, 422),
    (UnsupportedMediaTypeError, 415),
    (RateLimitedError, 429),
    (NoCapacityError, 503),
    (DeadlineExceededError, 504),
    (ProtocolVersionError, 400),
    (InvalidReferenceError, 400),
    (StoreNotFound, 404),
    (SnapshotterError, 502),
]


def status_for(exc: Exception) -> int:
    for cls, status in STATUS_BY_ERROR:
        if isinstance(exc, cls):
            return status
    return 500


# The database restarting, unreachable or busy: the request may be retried shortly.
DATABASE_RETRY_AFTER_S = 1.0


def _database_unavailable(exc: Exception) -> JSONResponse:
    detail = (
        "the database is unavailable right now (restarting, unreachable or busy); retry "
        "the request shortly, with an Idempotency-Key so that a call is not sent twice"
    )
    headers = {"Retry-After": retry_after_header(DATABASE_RETRY_AFTER_S)}
    return JSONResponse({"detail": detail}, status_code=503, headers=headers)


# What the app answers itself; anything else is a bug: 500, with its traceback logged.
HANDLED = (ControlPlaneError, ProtocolVersionError, SnapshotterError, OperationalError)


def response_for(exc: Exception) -> JSONResponse:
    """The response for an error the app maps (``HANDLED``); raising ones it does not."""
    if isinstance(exc, OperationalError):
        return _database_unavailable(exc)
    if not isinstance(exc, HANDLED):
        raise exc
    status = status_for(exc)
    headers: dict[str, str] = {}
    body: dict[str, object] = {"detail": str(exc)}
    if isinstance(exc, DeadlineExceededError):
        headers = call_headers(exc.call_id, cold=bool(exc.phases_ms), phases_ms=exc.phases_ms)
        body.update(call_id=exc.call_id, phases_ms=exc.phases_ms)
    if isinstance(exc, RateLimitedError):
        headers["Retry-After"] = retry_after_header(exc.retry_after_s)
    if isinstance(exc, UnauthorizedError):
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse(body, status_code=status, headers=headers)


async def _handle(request: Request, exc: Exception) -> JSONResponse:
    return response_for(exc)


def install(app: FastAPI) -> None:
    for cls in HANDLED:
        app.add_exception_handler(cls, _handle)
