"""Chunk codec: how one chunk's raw bytes are framed in a store.

A stored chunk object is a 16-byte frame header followed by the payload::

    offset  size  field
    0       4     magic  b"THC1"
    4       1     codec  0 = raw, 1 = zstd
    5       3     reserved, zero
    8       8     raw_size_bytes, little-endian u64

zstd is used only when it saves at least ``MIN_SAVING`` of the raw size;
otherwise the chunk is stored raw, because decompressing incompressible
weights costs more than reading the extra bytes.

Decoding is capped: the caller passes the size the manifest declares, and a
frame that claims, or expands to, more than that is rejected before any
buffer of the claimed size is allocated.
"""

from __future__ import annotations

import enum
import struct

import zstandard

from snapshotter.errors import ChunkTooLargeError, IntegrityError

MAGIC = b"THC1"
HEADER = struct.Struct("<4sB3xQ")
HEADER_SIZE = HEADER.size
MIN_SAVING = 0.10
ZSTD_LEVEL = 3


class Codec(enum.IntEnum):
    RAW = 0
    ZSTD = 1

    @property
    def label(self) -> str:
        return self.name.lower()


def encode(raw: bytes | memoryview) -> tuple[bytes, Codec]:
    """Frame ``raw`` for storage, compressed when that pays. Returns (object, codec)."""
    raw_size = len(raw)
    packed = zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(raw) if raw_size else b""
    if raw_size and len(packed) <= raw_size * (1 - MIN_SAVING):
        return HEADER.pack(MAGIC, Codec.ZSTD, raw_size) + packed, Codec.ZSTD
    return HEADER.pack(MAGIC, Codec.RAW, raw_size) + bytes(raw), Codec.RAW


def read_header(obj: bytes | memoryview, declared_size: int) -> tuple[Codec, memoryview]:
    """Check a frame header against the declared size; return (codec, payload)."""
    view = memoryview(obj)
    if len(view) < HEADER_SIZE:
        raise IntegrityError(f"chunk object is {len(view)} bytes, shorter than its frame header")
    magic, codec_id, raw_size = HEADER.unpack_from(view)
    if magic != MAGIC:
        raise IntegrityError(f"chunk object has bad magic {magic!r}")
    if raw_size != declared_size:
        raise ChunkTooLargeError(
            f"chunk frame claims {raw_size} bytes but the manifest declares {declared_size}"
        )
    try:
        codec = Codec(codec_id)
    except ValueError:
        raise IntegrityError(f"chunk object names unknown codec {codec_id}") from None
    return codec, view[HEADER_SIZE:]


def decode_into(obj: bytes | memoryview, dest: memoryview, declared_size: int) -> Codec:
    """Decode a stored chunk into ``dest`` (exactly ``declared_size`` bytes).

    ``dest`` is owned by the caller and is fully written on success; on failure
    its contents are undefined. Never allocates more than ``declared_size``.
    """
    if len(dest) != declared_size:
        raise ValueError(f"destination is {len(dest)} bytes, chunk is {declared_size}")
    codec, payload = read_header(obj, declared_size)
    decode_payload_into(codec, payload, dest)
    return codec


def decode_payload_into(codec: Codec, payload: memoryview, dest: memoryview) -> None:
    """Decode a frame's payload (its header already checked) into all of ``dest``."""
    declared_size = len(dest)
    if codec is Codec.RAW:
        if len(payload) != declared_size:
            raise IntegrityError(
                f"raw chunk holds {len(payload)} bytes but declares {declared_size}"
            )
        dest[:] = payload
        return
    _zstd_into(payload, dest, declared_size)


def decode(obj: bytes | memoryview, declared_size: int) -> bytes:
    """Decode a stored chunk into new bytes of exactly ``declared_size``."""
    out = bytearray(declared_size)
    decode_into(obj, memoryview(out), declared_size)
    return bytes(out)


def _zstd_into(payload: memoryview, dest: memoryview, declared_size: int) -> None:
    try:
        claimed = zstandard.frame_content_size(payload)
    except zstandard.ZstdError as exc:
        raise IntegrityError(f"zstd frame header is unreadable: {exc}") from None
    if claimed > declared_size:
        raise ChunkTooLargeError(
            f"zstd frame claims {claimed} bytes, more than the declared {declared_size}"
        )
    reader = zstandard.ZstdDecompressor().stream_reader(payload, read_across_frames=False)
    try:
        written = 0
        while written < declared_size:
            n = reader.readinto(dest[written:])
            if n == 0:
                break
            written += n
        overflow = reader.read(1)
    except zstandard.ZstdError as exc:
        raise IntegrityError(f"zstd payload is corrupt: {exc}") from None
    if overflow:
        raise ChunkTooLargeError(f"zstd payload expands past the declared {declared_size} bytes")
    if written != declared_size:
        raise IntegrityError(f"zstd payload expands to {written} bytes, not {declared_size}")
