"""Length-prefixed JSON frames over a stream socket.

One frame on the wire::

    offset  size  field
    0       4     length of the body in bytes, big-endian u32
    4       n     body: one JSON object, UTF-8

Frames larger than ``MAX_FRAME_BYTES`` are refused on both sides, so a
broken peer cannot make the other allocate without bound. A reader that
sees the peer close between frames gets ``PeerClosedError``; a close in the
middle of a frame is a ``FrameError``.

``FrameSocket`` serializes writers with a lock (calls run on several threads
and each writes its own frames); reads are expected from one thread.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading
from typing import Any

LENGTH = struct.Struct(">I")
MAX_FRAME_BYTES = 64 << 20


class FrameError(Exception):
    """The byte stream does not hold a valid frame."""


class PeerClosedError(FrameError):
    """The peer closed the connection at a frame boundary."""


def encode_frame(message: dict[str, Any]) -> bytes:
    body = json.dumps(message, separators=(",", ":")).encode()
    if len(body) > MAX_FRAME_BYTES:
        raise FrameError(
            f"frame of {len(body)} bytes exceeds the {MAX_FRAME_BYTES}-byte limit; "
            "stream large outputs as several chunks"
        )
    return LENGTH.pack(len(body)) + body


def _recv_exact(sock: socket.socket, size: int, *, at_boundary: bool) -> bytes:
    buf = bytearray()
    while len(buf) < size:
        part = sock.recv(size - len(buf))
        if not part:
            if at_boundary and not buf:
                raise PeerClosedError("peer closed the connection")
            raise FrameError(f"connection closed after {len(buf)} of {size} bytes of a frame")
        buf += part
    return bytes(buf)


def recv_frame(sock: socket.socket) -> dict[str, Any]:
    """Block until one whole frame arrives; return its JSON object."""
    (size,) = LENGTH.unpack(_recv_exact(sock, LENGTH.size, at_boundary=True))
    if size > MAX_FRAME_BYTES:
        raise FrameError(f"peer announced a {size}-byte frame, over {MAX_FRAME_BYTES}")
    body = _recv_exact(sock, size, at_boundary=False)
    try:
        message = json.loads(body)
    except ValueError as exc:
        raise FrameError(f"frame body is not JSON: {exc}") from None
    if not isinstance(message, dict):
        raise FrameError(f"frame body is a {type(message).__name__}, expected a JSON object")
    return message


class FrameSocket:
    """A connected stream socket speaking frames; ``send`` is thread-safe."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._write_lock = threading.Lock()

    def send(self, message: dict[str, Any]) -> None:
        data = encode_frame(message)
        with self._write_lock:
            self.sock.sendall(data)

    def recv(self) -> dict[str, Any]:
        return recv_frame(self.sock)

    def close(self) -> None:
        with contextlib.suppress(OSError):  # already closed by the peer
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
