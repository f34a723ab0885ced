"""A server-sent-events response that notices its client went away.

The ASGI server keeps accepting a response's writes after its client has
disconnected, or cancels the response's task, so a server-sent-events body
would run on unnoticed. ``EventStream`` sends its body's chunks until the body
ends or the client leaves, and in the second case (or when the response is
cancelled for it) calls ``on_gone`` once, shielded from that cancellation.

The connection is watched by a task of its own that waits for the server's
``http.disconnect`` and, when it comes, cancels the stream's scope, so a stream
waiting for its next event ends at once. Starlette's ``Request.is_disconnected``
polls instead, in a cancel scope whose cancel formats the task's repr: at 32
streams that poll, once per event, was a fifth of the server's CPU. Its
``StreamingResponse`` runs each response in a task group of two tasks, one of
them a second watch of the connection: about 100 µs a response, which the calls
of a burst pay one after another on the server's one event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator, Mapping

import anyio
from starlette.concurrency import iterate_in_threadpool, run_in_threadpool
from starlette.responses import Response
from starlette.types import Receive, Scope, Send


class EventStream(Response):
    """``body``'s chunks as ``text/event-stream`` until it ends (a blocking iterator
    runs on worker threads); ``on_gone`` (blocking, run on a worker thread) if the
    client disconnects first. An asynchronous ``body`` is closed either way. The
    request's body must have been read: what the server sends after it is its
    disconnect."""

    media_type = "text/event-stream"

    def __init__(
        self,
        body: Iterator[bytes] | AsyncIterator[bytes],
        on_gone: Callable[[], None],
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.body_iterator = body
        self.on_gone = on_gone
        self.status_code = 200
        self.background = None
        self.init_headers(headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = self.body_iterator
        chunks = body if isinstance(body, AsyncIterator) else iterate_in_threadpool(body)
        ended = False
        with anyio.CancelScope() as stream:

            def gone(_: object) -> None:
                stream.cancel()

            watch = asyncio.ensure_future(_disconnected(receive))
            watch.add_done_callback(gone)
            try:
                start = {"type": "http.response.start", "status": 200}
                await send({**start, "headers": self.raw_headers})
                async for chunk in chunks:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                ended = True
            except OSError:
                pass  # the connection failed under the write: the client is gone
            finally:
                watch.remove_done_callback(gone)
                watch.cancel()
                with anyio.CancelScope(shield=True):
                    if isinstance(body, AsyncGenerator):
                        await body.aclose()
                    if not ended:
                        await run_in_threadpool(self.on_gone)


async def _disconnected(receive: Receive) -> None:
    """Returns once the client is gone (a server that cannot say counts as gone)."""
    with contextlib.suppress(Exception):
        while (await receive())["type"] != "http.disconnect":
            pass  # nothing else comes after the body, by the ASGI spec
