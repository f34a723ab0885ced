"""Errors the control plane's services raise; the HTTP layer maps each to a status.

    ControlPlaneError
    ├── BadRequestError              400  a spec names a missing model/adapter, bad bundle;
    │                                     an invoke body nested deeper than ``max_body_depth``
    ├── UnauthorizedError            401  no API key, or an unknown/revoked one
    ├── ForbiddenError               403  the key lacks the scope, or is for another function
    ├── NotFoundError                404  no such function, call, key, model, worker, replica
    ├── ConflictError                409  in use, already final, idempotency mismatch
    ├── PayloadTooLargeError         413  body over ``max_body_bytes``
    ├── UnprocessableError           422  a change whose result is invalid (scaling min > max)
    ├── UnsupportedMediaTypeError    415  an invoke body that is not JSON
    ├── RateLimitedError             429  the key or function is over its rate limit
    ├── NoCapacityError              503  no worker can take a replica now
    └── DeadlineExceededError        504  a synchronous call ran past its deadline

Every message says what was wrong and, where there is one, what to do.
The mapping lives in ``control_plane.api.errors`` and nowhere else.
"""

from __future__ import annotations


class ControlPlaneError(Exception):
    """Base of every error the control plane raises on purpose."""


class BadRequestError(ControlPlaneError):
    pass


class UnauthorizedError(ControlPlaneError):
    pass


class ForbiddenError(ControlPlaneError):
    pass


class NotFoundError(ControlPlaneError):
    pass


class ConflictError(ControlPlaneError):
    pass


class PayloadTooLargeError(ControlPlaneError):
    pass


class UnprocessableError(ControlPlaneError):
    pass


class UnsupportedMediaTypeError(ControlPlaneError):
    pass


class RateLimitedError(ControlPlaneError):
    """Over a key's or a function's rate limit; ``retry_after_s`` until a token is back."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class DeadlineExceededError(ControlPlaneError):
    """A synchronous call's deadline passed; ``call_id`` and the phases so far ride along."""

    def __init__(self, message: str, call_id: str, phases_ms: dict[str, float]) -> None:
        super().__init__(message)
        self.call_id = call_id
        self.phases_ms = phases_ms


class NoCapacityError(ControlPlaneError):
    """No healthy worker can take a replica now (503); the call stays queued."""
