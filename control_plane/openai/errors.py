"""Errors as OpenAI's API gives them, so its SDK raises the matching exception::

HTTP 400  {"error": {"message": ..., "type": "invalid_request_error",
                     "param": "max_tokens", "code": null}}
HTTP 401  authentication_error      HTTP 404  not_found_error (code model_not_found)
HTTP 403  permission_error          HTTP 429  rate_limit_error
HTTP 5xx  server_error              HTTP 504  timeout (code "timeout")
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


@dataclass
class OpenAIError(Exception):
    """A request refused or failed, with the status and the body OpenAI would give."""

    status: int
    message: str
    param: str | None = None
    code: str | None = None

    def __str__(self) -> str:
        return self.message

    def body(self) -> dict[str, Any]:
        kind = _TYPES.get(self.status, "server_error")
        error = {"message": self.message, "type": kind, "param": self.param, "code": self.code}
        return {"error": error}


def invalid(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param, code)


def model_not_found(model: str, known: list[str]) -> OpenAIError:
    listed = ", ".join(known) or "none deployed"
    return OpenAIError(
        404,
        f"The model {model!r} does not exist: it names no LLM function (or function:adapter, "
        f"an adapter it lists or one pushed to the store) this key may call ({listed}); see "
        "GET /openai/v1/models",
        "model",
        "model_not_found",
    )
