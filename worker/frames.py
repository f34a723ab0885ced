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
READ_SIZE = 64 << 10


class FrameError(Exception):
    """The byte stream does not hold a valid frame."""


class PeerClosedError(FrameError):
    """The peer closed the connection at a frame boundary."""


def encode_frame(message: dict[str, Any], *, allow_nan: bool = True) -> bytes:
    body = json.dumps(message, separators=(",", ":"), allow_nan=allow_nan).encode()
    if len(body) > MAX_FRAME_BYTES:
        raise FrameError(
            f"frame of {len(body)} bytes exceeds the {MAX_FRAME_BYTES}-byte limit; "
            "stream large outputs as several chunks"
        )
    return LENGTH.pack(len(body)) + body


def _decode(body: bytes | bytearray) -> dict[str, Any]:
    """One frame's body as its JSON object."""
    try:
        message = json.loads(body.decode())  # a str: json need not guess the encoding
    except ValueError as exc:  # UnicodeDecodeError too
        raise FrameError(f"frame body is not JSON: {exc}") from None
    if not isinstance(message, dict):
        raise FrameError(f"frame body is a {type(message).__name__}, expected a JSON object")
    return message


class FrameSocket:
    """A connected stream socket speaking frames; ``send`` is thread-safe.

    Reads take whatever the socket holds (up to ``READ_SIZE``) and keep what
    follows the frame for the next ``recv``: a frame usually arrives whole, in one
    ``recv`` call instead of two. So every read of the socket must go through
    this object once it has read."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._write_lock = threading.Lock()
        self._buf = bytearray()

    def send(self, message: dict[str, Any]) -> None:
        self.send_frame(encode_frame(message))

    def send_frame(self, data: bytes) -> None:
        """Send a frame ``encode_frame`` made."""
        with self._write_lock:
            self.sock.sendall(data)

    def recv(self) -> dict[str, Any]:
        """Block until one whole frame arrives; return its JSON object."""
        self._fill(LENGTH.size, at_boundary=True)
        (size,) = LENGTH.unpack_from(self._buf)
        if size > MAX_FRAME_BYTES:
            raise FrameError(f"peer announced a {size}-byte frame, over {MAX_FRAME_BYTES}")
        end = LENGTH.size + size
        self._fill(end, at_boundary=False)
        body = self._buf[LENGTH.size : end]
        del self._buf[:end]
        return _decode(body)

    def buffered(self) -> bool:
        """Whether ``recv`` returns without waiting: a whole frame is read already (or a
        length over the limit, which it refuses)."""
        if len(self._buf) < LENGTH.size:
            return False
        (size,) = LENGTH.unpack_from(self._buf)
        return size > MAX_FRAME_BYTES or len(self._buf) >= LENGTH.size + size

    def recv_ready(self) -> list[dict[str, Any]]:
        """One read of a socket that has something to read (a selector said so), then
        every whole frame read so far; ``[]`` while a frame is still incomplete."""
        part = self.sock.recv(READ_SIZE)
        if not part:
            if not self._buf:
                raise PeerClosedError("peer closed the connection")
            raise FrameError(f"connection closed after {len(self._buf)} bytes of a frame")
        self._buf += part
        frames = []
        while self.buffered():
            frames.append(self.recv())
        return frames

    def _fill(self, size: int, *, at_boundary: bool) -> None:
        """Read until the buffer holds ``size`` bytes."""
        while len(self._buf) < size:
            part = self.sock.recv(max(READ_SIZE, size - len(self._buf)))
            if not part:
                if at_boundary and not self._buf:
                    raise PeerClosedError("peer closed the connection")
                raise FrameError(
                    f"connection closed after {len(self._buf)} of {size} bytes of a frame"
                )
            self._buf += part

    def close(self) -> None:
        with contextlib.suppress(OSError):  # already closed by the peer
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
