"""Streamed direct calls, read on one thread (``DirectChannel.stream``).

A streamed call over a worker's direct port sends an event for every step of its
stream. Read by a thread per call, every event wakes that call's thread, and with
many streams at once the wake-ups, not the events, are the control plane's CPU
(``bench/handoff.py``). Here one thread waits on the connections of every streamed
call with a selector, and hands each event to its call's ``on_event`` as it is read:
the events of a step of many streams wake one thread::

    the call's thread                          the reader (one per channel)
      stream(addr, token, msg, on_event,        follows the call's connection:
             on_lost): the call is sent         on_event(event) for each event, in
      waits for what on_event hands it            order, on the reader's thread (it
      after recording the final event:            must not block); the final: stops
        ack() (the connection is reused)          following
      past its deadline: abandon()              a broken connection, a bad frame,
                                                  abandon(): closed, then on_lost(error)

Exactly one of the two ends each stream: its final event through ``on_event``, or
``on_lost``.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from control_plane.protocol import FINAL_CALL_EVENTS, CallEvent
from worker.frames import FrameError, FrameSocket

if TYPE_CHECKING:
    from control_plane.dispatch.direct import DirectChannel

log = logging.getLogger(__name__)

OnEvent = Callable[[CallEvent], None]
OnLost = Callable[[Exception], None]


class DirectStream:
    """One streamed call on its connection, from its send to its final event."""

    def __init__(
        self,
        channel: DirectChannel,
        addr: str,
        token: str,
        call_id: str,
        conn: FrameSocket,
        on_event: OnEvent,
        on_lost: OnLost,
    ) -> None:
        self.channel = channel
        self.addr = addr
        self.token = token
        self.call_id = call_id
        self.conn = conn
        self.on_event = on_event
        self.on_lost = on_lost
        self.following = False  # changed by the reader's thread only

    def ack(self) -> None:
        """The final event is recorded: tell the worker, and reuse the connection."""
        try:
            self.conn.send({"ack": self.call_id})
        except OSError:
            self.conn.close()  # the worker reports it over HTTP
            return
        self.channel.put_idle(self.addr, self.token, self.conn)

    def abandon(self) -> None:
        """Stop reading (past the deadline): closed, and lost unless its end came."""
        self.channel.streams().drop(self)


class StreamReader:
    """The thread that reads every followed stream's connection."""

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._lock = threading.Lock()
        self._added: list[DirectStream] = []
        self._dropped: list[DirectStream] = []
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="thaw-direct-streams", daemon=True)
        self._thread.start()

    def add(self, stream: DirectStream) -> None:
        with self._lock:
            closed = self._closed
            if not closed:
                self._added.append(stream)
        if closed:
            stream.conn.close()
            stream.on_lost(FrameError("the control plane is shutting down"))
            return
        self._wake()

    def drop(self, stream: DirectStream) -> None:
        with self._lock:
            self._dropped.append(stream)
        self._wake()

    def close(self) -> None:
        """Stop: streams still followed end lost."""
        with self._lock:
            self._closed = True
        self._wake()
        self._thread.join(timeout=5)

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):  # a wake-up is pending already
            self._wake_w.send(b"\0")

    def _loop(self) -> None:
        while True:
            for key, _ in self._selector.select():
                if key.data is None:
                    if not self._take_orders():
                        self._stop()
                        return
                else:
                    self._read(key.data)

    def _take_orders(self) -> bool:
        """Follow the streams added, end those dropped; False once closed."""
        with contextlib.suppress(BlockingIOError):
            while self._wake_r.recv(4096):
                pass
        with self._lock:
            added, self._added = self._added, []
            dropped, self._dropped = self._dropped, []
            closed = self._closed
        for stream in added:
            try:
                self._selector.register(stream.conn.sock, selectors.EVENT_READ, stream)
                stream.following = True
            except (OSError, ValueError) as exc:  # closed meanwhile
                stream.following = True
                self._lose(stream, exc)
        for stream in dropped:
            if stream.following:  # not ended meanwhile
                self._lose(stream, TimeoutError("no final event before the call's deadline"))
        return not closed

    def _read(self, stream: DirectStream) -> None:
        try:
            for frame in stream.conn.recv_ready():
                event = CallEvent.model_validate(frame.get("event"))
                stream.on_event(event)
                if event.kind in FINAL_CALL_EVENTS:
                    self._unfollow(stream)
                    return
        except (OSError, FrameError, ValueError) as exc:  # ValidationError is a ValueError
            self._lose(stream, exc)
        except Exception as exc:  # a bug in on_event must not stop the other streams
            log.exception("reading the stream of call %s failed", stream.call_id)
            self._lose(stream, exc)

    def _unfollow(self, stream: DirectStream) -> None:
        stream.following = False
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._selector.unregister(stream.conn.sock)

    def _lose(self, stream: DirectStream, exc: Exception) -> None:
        if not stream.following:
            return
        self._unfollow(stream)
        stream.conn.close()
        stream.on_lost(exc)

    def _stop(self) -> None:
        for key in list(self._selector.get_map().values()):
            if key.data is not None:
                self._lose(key.data, FrameError("the control plane is shutting down"))
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()
