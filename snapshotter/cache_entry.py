"""One entry of the disk cache: a chunk's bytes behind a header that records their checksum.

An entry is the store's frame (``snapshotter.codec``) with another magic and
a 16-byte extension::

    offset  size  field
    0       4     magic b"THK1"
    4       1     codec  0 = raw, 1 = zstd (as the store's frame)
    5       3     reserved, zero
    8       8     raw_size_bytes, little-endian u64
    16      8     checksum: xxh3-64 of the raw (decoded) bytes, little-endian u64
    24      8     reserved, zero
    32            payload: the raw bytes, or a zstd frame of them

The checksum is computed from bytes already verified against their digest
and written in the same file, so the entry and its checksum are renamed into
place together. An entry that starts with the store's own magic (``THC1``,
16-byte header) was written by an older thaw: it carries no checksum and is
read as untrusted (checked with its digest, then written again with one).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from snapshotter import codec
from snapshotter.errors import ChunkTooLargeError, IntegrityError

MAGIC = b"THK1"
EXTENSION = struct.Struct("<Q8x")
HEADER_SIZE = codec.HEADER_SIZE + EXTENSION.size


@dataclass(frozen=True)
class EntryHeader:
    """What an entry's header says: ``checksum`` None for an older entry (no record)."""

    codec: codec.Codec
    header_bytes: int  # where the payload starts
    checksum: int | None


def pack_header(kind: codec.Codec, raw_size: int, checksum: int) -> bytes:
    return codec.HEADER.pack(MAGIC, kind, raw_size) + EXTENSION.pack(checksum)


def read_frame(frame: bytes, declared_size: int) -> tuple[codec.Codec, bool]:
    """(codec, has a checksum extension) from an entry's first ``codec.HEADER_SIZE`` bytes.

    Raises ``IntegrityError`` for a short or unknown header and
    ``ChunkTooLargeError`` when it claims another size than ``declared_size``.
    """
    if len(frame) < codec.HEADER_SIZE:
        raise IntegrityError(f"cache entry is {len(frame)} bytes, shorter than its header")
    magic, codec_id, raw_size = codec.HEADER.unpack_from(frame)
    if magic not in (MAGIC, codec.MAGIC):
        raise IntegrityError(f"cache entry has bad magic {magic!r}")
    if raw_size != declared_size:
        raise ChunkTooLargeError(
            f"cache entry claims {raw_size} bytes but the manifest declares {declared_size}"
        )
    try:
        kind = codec.Codec(codec_id)
    except ValueError:
        raise IntegrityError(f"cache entry names unknown codec {codec_id}") from None
    return kind, magic == MAGIC


def read_extension(extension: bytes) -> int:
    """The checksum from the 16 bytes after the frame; ``IntegrityError`` when short."""
    if len(extension) != EXTENSION.size:
        raise IntegrityError("cache entry is truncated inside its header")
    (checksum,) = EXTENSION.unpack(extension)
    return int(checksum)


def parse(entry: bytes, declared_size: int) -> tuple[EntryHeader, memoryview]:
    """(header, payload) of a whole entry held in memory."""
    kind, extended = read_frame(entry[: codec.HEADER_SIZE], declared_size)
    if not extended:
        return EntryHeader(kind, codec.HEADER_SIZE, None), memoryview(entry)[codec.HEADER_SIZE :]
    checksum = read_extension(entry[codec.HEADER_SIZE : HEADER_SIZE])
    return EntryHeader(kind, HEADER_SIZE, checksum), memoryview(entry)[HEADER_SIZE:]


def decode_into(entry: bytes, dest: memoryview) -> EntryHeader:
    """Decode a whole entry into ``dest`` (exactly the chunk's size); its header.

    Checks the frame, not the bytes: the caller compares the checksum (or,
    with none, the digest).
    """
    header, payload = parse(entry, len(dest))
    codec.decode_payload_into(header.codec, payload, dest)
    return header


def decode(entry: bytes, declared_size: int) -> bytes:
    """A whole entry's raw bytes (not checked, as ``decode_into``)."""
    out = bytearray(declared_size)
    decode_into(entry, memoryview(out))
    return bytes(out)
