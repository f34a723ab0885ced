"""Refusing request bodies over ``max_body_bytes`` (413) before they are read whole.

Pure ASGI: checks ``Content-Length`` up front and counts chunked bodies as
they arrive, so a client cannot stream past the limit either. A chunked body
found too large while the app reads it is an ``HTTPException`` (413, naming
the setting): FastAPI answers any other error raised by a body read with its
own "There was an error parsing the body" (400).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class _TooLarge(HTTPException):
    def __init__(self, limit: int, setting: str) -> None:
        super().__init__(413, _too_large(limit, setting))


class BodySizeLimit:
    """``path_limits`` maps an exact path to (its own limit, the setting that sets it):
    folder uploads from the console are far larger than any JSON body."""

    def __init__(
        self,
        app: ASGIApp,
        max_body_bytes: int,
        path_limits: Mapping[str, tuple[int, str]] | None = None,
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.path_limits = dict(path_limits or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, setting = self.path_limits.get(
            scope.get("path", ""), (self.max_body_bytes, "THAW_MAX_BODY_BYTES")
        )
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await self._refuse(send, limit, setting)
            return
        seen = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise _TooLarge(limit, setting)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except _TooLarge:
            if not started:
                await self._refuse(send, limit, setting)

    async def _refuse(self, send: Send, limit: int, setting: str) -> None:
        detail: dict[str, Any] = {"detail": _too_large(limit, setting)}
        body = json.dumps(detail).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _too_large(limit: int, setting: str) -> str:
    return (
        f"request body exceeds {limit} bytes ({setting}); "
        "send large inputs by reference, e.g. a URL"
    )
