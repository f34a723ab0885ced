"""Running one call straight on a worker's direct call port (``worker.dataplane``).

The conversation is drawn in ``worker/dataplane.py``. Connections are kept
per worker address and reused, one call at a time each; a connection comes
back to the pool only after its call's final event. A call's events are read
by its caller's thread (``run``), or, for a streamed call, by one thread for
every stream (``stream``, ``dispatch.direct_streams``).

Failures, by what the caller may conclude:

- ``UnsendableError`` (``dispatch.base``): the call cannot be encoded; it was
  not sent and never can be. The caller ends it failed.
- ``DirectUnavailableError``: the call was certainly not sent (no connection
  could be made); the caller may put it back in the queue.
- ``DirectLostError``: the call was sent, but the connection broke or its
  deadline passed before the final event. The worker still ends it: it
  reports over HTTP what it cannot write back, and a lost worker's calls are
  re-queued by the control plane. The caller waits on the database.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

from control_plane.dispatch.base import encode
from control_plane.dispatch.direct_streams import DirectStream, OnEvent, StreamReader
from control_plane.protocol import FINAL_CALL_EVENTS, CallEvent, RunCall
from worker.frames import FrameError, FrameSocket

CONNECT_TIMEOUT_S = 2.0
MAX_IDLE_PER_WORKER = 64


class DirectUnavailableError(Exception):
    """No connection to the worker's direct port: the call was not sent."""


class DirectLostError(Exception):
    """The call was sent; its final event did not come back on the connection."""


class DirectChannel:
    def __init__(self, connect_timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        self.connect_timeout_s = connect_timeout_s
        self._lock = threading.Lock()
        self._idle: dict[tuple[str, str], list[FrameSocket]] = {}
        self._streams: StreamReader | None = None

    def run(self, addr: str, token: str, msg: RunCall, timeout_s: float) -> Iterator[CallEvent]:
        """The call's events, through its final one. Raises the errors above.

        The final event is acknowledged to the worker when the caller asks for
        the next item (a ``for`` loop does, after its body): record it first.
        A caller that stops early leaves it unacknowledged; the worker then
        reports it over HTTP."""
        conn = self._send(addr, token, msg)
        ended = False
        try:
            conn.sock.settimeout(max(0.001, timeout_s))
            while True:
                event = CallEvent.model_validate(conn.recv().get("event"))
                final = event.kind in FINAL_CALL_EVENTS
                yield event  # the caller records it before asking for more
                if final:
                    conn.send({"ack": msg.call_id})
                    ended = True
                    break
        except (OSError, FrameError, ValueError) as exc:
            raise DirectLostError(f"lost call {msg.call_id} on {addr}: {exc}") from None
        finally:
            if ended:
                self.put_idle(addr, token, conn)
            else:  # broken, timed out, or abandoned by the caller mid-call
                conn.close()

    def stream(
        self,
        addr: str,
        token: str,
        msg: RunCall,
        on_event: OnEvent,
        on_lost: Callable[[DirectLostError], None],
    ) -> DirectStream:
        """Send ``msg`` and hand its events to ``on_event`` as they come, on the thread
        that reads every stream (``dispatch.direct_streams``); ``on_lost`` instead
        where its final event cannot come. Raises the errors above if it was not sent."""
        conn = self._send(addr, token, msg)
        conn.sock.settimeout(None)  # read when there is something to read

        def lost(exc: Exception) -> None:
            on_lost(DirectLostError(f"lost call {msg.call_id} on {addr}: {exc}"))

        stream = DirectStream(self, addr, token, msg.call_id, conn, on_event, lost)
        self.streams().add(stream)
        return stream

    def streams(self) -> StreamReader:
        """The thread reading streamed calls' connections, started on first use."""
        with self._lock:
            if self._streams is None:
                self._streams = StreamReader()
            return self._streams

    def cancel(self, addr: str, token: str, call_id: str) -> None:
        """Tell the worker to stop ``call_id`` now (best effort: its heartbeat reply
        says so too). Raises ``DirectUnavailableError`` or ``DirectLostError``."""
        conn = self._send_frame(addr, token, {"cancel": call_id}, f"cancelling call {call_id}")
        self.put_idle(addr, token, conn)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, {}
            streams, self._streams = self._streams, None
        if streams is not None:
            streams.close()
        for conns in idle.values():
            for conn in conns:
                conn.close()

    def _send(self, addr: str, token: str, msg: RunCall) -> FrameSocket:
        return self._send_frame(addr, token, {"run": encode(msg)}, f"sending call {msg.call_id}")

    def _send_frame(self, addr: str, token: str, frame: dict[str, Any], what: str) -> FrameSocket:
        """``frame`` sent on an idle connection to ``addr``, else a new one; that
        connection. Raises ``DirectUnavailableError`` or ``DirectLostError``."""
        pooled = self._take(addr, token)
        if pooled is not None:
            try:
                pooled.send(frame)
                return pooled
            except OSError:
                pooled.close()  # the worker closed it while idle (restarted): dial again
        conn = self._dial(addr, token)
        try:
            conn.send(frame)
        except OSError as exc:
            conn.close()
            raise DirectLostError(f"{what} to {addr}: {exc}") from None
        return conn

    def _dial(self, addr: str, token: str) -> FrameSocket:
        host, _, port = addr.rpartition(":")
        try:
            sock = socket.create_connection((host, int(port)), timeout=self.connect_timeout_s)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = FrameSocket(sock)
            conn.send({"hello": token})
        except (OSError, ValueError) as exc:
            raise DirectUnavailableError(f"worker port {addr}: {exc}") from None
        return conn

    def _take(self, addr: str, token: str) -> FrameSocket | None:
        while True:
            with self._lock:
                conns = self._idle.get((addr, token))
                conn = conns.pop() if conns else None
            if conn is None or _idle_and_open(conn):
                return conn
            conn.close()

    def put_idle(self, addr: str, token: str, conn: FrameSocket) -> None:
        """A connection whose call ended, for the next call to ``addr``."""
        with self._lock:
            conns = self._idle.setdefault((addr, token), [])
            if len(conns) < MAX_IDLE_PER_WORKER:
                conns.append(conn)
                return
        with contextlib.suppress(OSError):
            conn.close()


def _idle_and_open(conn: FrameSocket) -> bool:
    """An idle connection has nothing to read; readable means the worker closed it."""
    try:
        readable, _, _ = select.select([conn.sock], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable
