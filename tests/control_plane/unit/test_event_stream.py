"""``EventStream``, the server-sent-events response of the invoke and OpenAI routes:
a body that ends is sent whole and closed; a client that leaves while the stream waits
for its next event ends the stream at once, its body closed and ``on_gone`` called
once; a write that fails counts as the client leaving. Driven as an ASGI server would."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from control_plane.api.disconnect import EventStream

SCOPE = {"type": "http", "asgi": {"spec_version": "2.3"}}


class Connection:
    """The server's side: what the response sent, and a disconnect to announce."""

    def __init__(self, fail_writes: bool = False) -> None:
        self.sent: list[dict[str, Any]] = []
        self.left = asyncio.Event()
        self.fail_writes = fail_writes

    async def receive(self) -> dict[str, Any]:
        await self.left.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        if self.fail_writes and message["type"] == "http.response.body":
            raise OSError("connection reset by peer")
        self.sent.append(message)

    def bodies(self) -> list[bytes]:
        return [m["body"] for m in self.sent if m["type"] == "http.response.body"]


class Body:
    """An async body of ``chunks``, then (``wait``) no next chunk until cancelled."""

    def __init__(self, chunks: list[bytes], wait: bool = False) -> None:
        self.chunks, self.wait = chunks, wait
        self.closed = False
        self.waiting = asyncio.Event()

    async def __call__(self) -> AsyncIterator[bytes]:
        try:
            for chunk in self.chunks:
                yield chunk
            if self.wait:
                self.waiting.set()
                await asyncio.Event().wait()  # the next event never comes
        finally:
            self.closed = True


def test_a_body_that_ends_is_sent_whole_with_its_headers() -> None:
    async def run() -> tuple[Connection, Body, list[int]]:
        conn, body, gone = Connection(), Body([b"data: 1\n\n", b"data: 2\n\n"]), []
        response = EventStream(body(), lambda: gone.append(1), headers={"X-Thaw-Call-Id": "c1"})
        await response(SCOPE, conn.receive, conn.send)
        return conn, body, gone

    conn, body, gone = asyncio.run(run())
    start = conn.sent[0]
    assert start["type"] == "http.response.start" and start["status"] == 200
    headers = dict(start["headers"])
    assert headers[b"content-type"] == b"text/event-stream; charset=utf-8"
    assert headers[b"x-thaw-call-id"] == b"c1"
    assert conn.bodies() == [b"data: 1\n\n", b"data: 2\n\n", b""]
    assert conn.sent[-1]["more_body"] is False
    assert body.closed and gone == []


def test_a_client_that_leaves_while_the_stream_waits_ends_it_at_once() -> None:
    async def run() -> tuple[Connection, Body, list[int], float]:
        conn, body, gone = Connection(), Body([b"data: 1\n\n"], wait=True), []
        served = asyncio.ensure_future(
            EventStream(body(), lambda: gone.append(1))(SCOPE, conn.receive, conn.send)
        )
        await asyncio.wait_for(body.waiting.wait(), 5)
        left_at = time.monotonic()
        conn.left.set()
        await asyncio.wait_for(served, 5)
        return conn, body, gone, time.monotonic() - left_at

    conn, body, gone, took = asyncio.run(run())
    assert conn.bodies() == [b"data: 1\n\n"]  # no end of body: the client is gone
    assert body.closed and gone == [1]
    assert took < 1.0, took


def test_a_write_that_fails_counts_as_the_client_leaving() -> None:
    async def run() -> tuple[Body, list[int]]:
        conn, body, gone = Connection(fail_writes=True), Body([b"data: 1\n\n"]), []
        await EventStream(body(), lambda: gone.append(1))(SCOPE, conn.receive, conn.send)
        return body, gone

    body, gone = asyncio.run(run())
    assert body.closed and gone == [1]


def test_a_blocking_body_runs_on_worker_threads() -> None:
    def chunks() -> Iterator[bytes]:
        yield b"data: a\n\n"
        yield b"data: b\n\n"

    async def run() -> Connection:
        conn = Connection()
        await EventStream(chunks(), lambda: None)(SCOPE, conn.receive, conn.send)
        return conn

    assert asyncio.run(run()).bodies() == [b"data: a\n\n", b"data: b\n\n", b""]
