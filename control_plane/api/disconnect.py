"""Noticing that a streaming client went away.

The ASGI server keeps accepting a response's writes after its client has
disconnected, or cancels the response's task, so a server-sent-events body
would run on unnoticed. ``until_disconnect`` checks the connection between
events and, when the client is gone (or the response was cancelled for it),
calls ``on_gone`` once, shielded from that cancellation.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator

import anyio
from starlette.concurrency import iterate_in_threadpool, run_in_threadpool
from starlette.requests import Request


async def until_disconnect(
    request: Request, body: Iterator[bytes] | AsyncIterator[bytes], on_gone: Callable[[], None]
) -> AsyncIterator[bytes]:
    """``body``'s chunks until it ends (a blocking iterator runs on worker threads);
    ``on_gone`` (blocking, run on a worker thread) if the client disconnects first.
    An asynchronous ``body`` is closed either way."""
    chunks = body if isinstance(body, AsyncIterator) else iterate_in_threadpool(body)
    ended = False
    try:
        async for chunk in chunks:
            if await request.is_disconnected():
                break
            yield chunk
        else:
            ended = True
    finally:
        with anyio.CancelScope(shield=True):
            if isinstance(body, AsyncGenerator):
                await body.aclose()
            if not ended:
                await run_in_threadpool(on_gone)
