"""The worker's direct call port: a warm call from the control plane without the broker.

A synchronous call that finds a ready replica with room is sent straight to
the worker over a persistent TCP connection, and its events come back on the
same connection; the broker and the HTTP event posts are skipped. The
conversation, in ``worker.frames`` frames::

    control plane                           worker
    {"hello": token}                  ──▶   (compared in constant time; a wrong
                                             token closes the connection)
    {"run": RunCall}                  ──▶   runs it on its replica
                                      ◀──   {"event": CallEvent}  (started, outputs…)
                                      ◀──   {"event": CallEvent}  (the final one)
    {"ack": call_id}                  ──▶   (sent once the result is in the database)
    {"run": RunCall}                  ──▶   the next call on the same connection …
    {"cancel": call_id}               ──▶   stop a call running here (its streaming
                                             client left), on an idle connection; no answer

One call at a time per connection; the control plane opens more connections
for concurrent calls. The token is this agent's own random secret, given to
the control plane only in its authenticated registration, so nothing else
that can reach the port can run a call.

Delivery guarantee: a final event counts as delivered only once its ack
arrives (a write into a connection whose peer just died can still succeed).
Without the ack within ``ACK_TIMEOUT_S`` it is posted over HTTP instead
(``ReplicaManager``'s usual path; a duplicate is answered 409 and dropped),
so a call that ran is recorded either way.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import secrets
import socket
import threading
from collections.abc import Callable

from pydantic import ValidationError

from control_plane.protocol import FINAL_CALL_EVENTS, CallEvent, RunCall
from worker.frames import FrameError, FrameSocket

log = logging.getLogger(__name__)

RunDirect = Callable[[RunCall, Callable[[CallEvent], bool]], None]
CancelCalls = Callable[[list[str]], None]
HELLO_TIMEOUT_S = 5.0
ACK_TIMEOUT_S = 10.0


class DataServer:
    """Listens on ``host:port`` (0: any free port) and runs calls with ``run``."""

    def __init__(
        self,
        run: RunDirect,
        host: str = "127.0.0.1",
        port: int = 0,
        cancel: CancelCalls | None = None,
    ) -> None:
        self._run = run
        self._cancel = cancel
        self.token = secrets.token_urlsafe(32)
        self._listener = socket.create_server((host, port), backlog=128)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="thaw-data", daemon=True)

    @property
    def port(self) -> int:
        return int(self._listener.getsockname()[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        with contextlib.suppress(OSError):  # not connected: closing is enough
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._thread.join(timeout=5)

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return  # the listener was closed
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        conn = FrameSocket(sock)
        try:
            if not self._greeted(conn):
                return
            while not self._stopped.is_set():
                frame = conn.recv()
                cancelled = frame.get("cancel")
                if isinstance(cancelled, str):
                    if self._cancel is not None:
                        self._cancel([cancelled])
                    continue
                msg = RunCall.model_validate(frame.get("run"))
                self._run(msg, _sink(conn, msg.call_id))
        except (FrameError, OSError):
            pass  # the control plane closed the connection: normal end
        except ValidationError:
            log.exception("refused a malformed direct call")
        finally:
            conn.close()

    def _greeted(self, conn: FrameSocket) -> bool:
        conn.sock.settimeout(HELLO_TIMEOUT_S)
        hello = conn.recv().get("hello")
        conn.sock.settimeout(None)
        if isinstance(hello, str) and hmac.compare_digest(hello, self.token):
            return True
        log.warning("refused a direct connection with a wrong token")
        return False


def _sink(conn: FrameSocket, call_id: str) -> Callable[[CallEvent], bool]:
    """Writes events back; False once the connection is gone, or when a final
    event is not acknowledged (HTTP takes over)."""
    broken = False

    def send(event: CallEvent) -> bool:
        nonlocal broken
        if broken:
            return False
        try:
            conn.send({"event": event.model_dump(mode="json")})
            if event.kind in FINAL_CALL_EVENTS:
                _await_ack(conn, call_id)
            return True
        except (OSError, FrameError):
            broken = True
            return False

    return send


def _await_ack(conn: FrameSocket, call_id: str) -> None:
    conn.sock.settimeout(ACK_TIMEOUT_S)
    try:
        ack = conn.recv().get("ack")
    finally:
        conn.sock.settimeout(None)
    if ack != call_id:
        raise FrameError(f"expected the ack of call {call_id}, got {ack!r}")
