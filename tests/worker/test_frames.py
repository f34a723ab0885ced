from __future__ import annotations

import socket
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from worker.frames import (
    MAX_FRAME_BYTES,
    FrameError,
    FrameSocket,
    PeerClosedError,
    encode_frame,
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(st.dictionaries(st.text(), json_values, max_size=5))
def test_frames_round_trip(message: dict) -> None:
    a, b = socket.socketpair()
    with a, b:
        FrameSocket(a).send(message)
        assert FrameSocket(b).recv() == message


def test_several_frames_in_one_read_are_split() -> None:
    a, b = socket.socketpair()
    with a, b:
        a.sendall(encode_frame({"n": 1}) + encode_frame({"n": 2}))
        reader = FrameSocket(b)
        assert reader.recv() == {"n": 1}
        assert reader.recv() == {"n": 2}


def test_close_at_boundary_is_peer_closed() -> None:
    a, b = socket.socketpair()
    with b:
        a.close()
        with pytest.raises(PeerClosedError):
            FrameSocket(b).recv()


def test_close_inside_a_frame_is_an_error_not_a_clean_close() -> None:
    a, b = socket.socketpair()
    with b:
        a.sendall(encode_frame({"x": "y"})[:-2])
        a.close()
        with pytest.raises(FrameError) as info:
            FrameSocket(b).recv()
        assert not isinstance(info.value, PeerClosedError)


def test_oversized_announcement_is_refused_before_reading() -> None:
    a, b = socket.socketpair()
    with a, b:
        a.sendall(struct.pack(">I", MAX_FRAME_BYTES + 1))
        with pytest.raises(FrameError, match="over"):
            FrameSocket(b).recv()


@pytest.mark.parametrize("body", [b"[1, 2]", b"not json", b'{"a": "\xc3\x28"}'])
def test_body_must_be_a_json_object(body: bytes) -> None:
    a, b = socket.socketpair()
    with a, b:
        a.sendall(struct.pack(">I", len(body)) + body)
        with pytest.raises(FrameError):
            FrameSocket(b).recv()
