"""What an invoke body must be before a call is accepted: JSON, nested at most
``THAW_MAX_BODY_DEPTH`` deep (its size is ``limits.BodySizeLimit``'s to check).

Both are checked on the raw bytes, before anything parses them (the depth scan is
``snapshotter.json_doc``'s, the one every pushed JSON file goes through). A body nested
past the parser's own recursion limit does not parse at all; one nested a few
hundred deep parses and is stored, then cannot be encoded into the message
that carries the call to its worker (pydantic stops serializing at about 250
levels), and the call would be left dispatched until its deadline. Refused
here, neither is ever a call.

``BodyCheckedRoute`` runs the check for ``routes.invoke``; ``fast_invoke`` hands
any body that fails it to that route, so both paths answer alike.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from control_plane.errors import BadRequestError, UnsupportedMediaTypeError
from snapshotter.json_doc import deeper_than, depths

__all__ = ["BodyCheckedRoute", "check", "deeper_than", "is_json", "nesting_depth"]

_JSON_TYPE = re.compile(r"application/([a-z0-9.+-]+\+)?json", re.IGNORECASE)


def nesting_depth(body: bytes) -> int:
    """How deeply a JSON text nests arrays and objects: a scalar 0, ``[]`` 1."""
    return max(depths(body))


def is_json(content_type: str | None) -> bool:
    """``application/json`` or ``application/<anything>+json``, parameters aside."""
    media_type = (content_type or "").split(";", 1)[0].strip()
    return _JSON_TYPE.fullmatch(media_type) is not None


def check(body: bytes, content_type: str | None, max_depth: int) -> None:
    """Raise what is wrong with an invoke body. An empty one passes: the route's
    validation says that the body is missing."""
    if not body:
        return
    if not is_json(content_type):
        raise UnsupportedMediaTypeError(
            f"an invoke body is JSON, sent with Content-Type: application/json "
            f"(this one came as {content_type or 'no content type'})"
        )
    if deeper_than(body, max_depth):
        raise BadRequestError(
            f"request body nests arrays and objects more than {max_depth} levels deep "
            f"(THAW_MAX_BODY_DEPTH); flatten the input, or send it by reference, e.g. a URL"
        )


class BodyCheckedRoute(APIRoute):
    """A route whose body is checked (``check``) before FastAPI parses it; what is
    wrong is raised to the app's error mapping (``api.errors``). It calls on through
    ``super()``, so it composes with other route classes."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def checked(request: Request) -> Response:
            body = await request.body()  # kept on the request: the handler reads it again
            max_depth = request.app.state.services.settings.max_body_depth
            check(body, request.headers.get("content-type"), max_depth)
            return await handler(request)

        return checked
