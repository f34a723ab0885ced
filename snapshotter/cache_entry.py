"""One entry of the disk cache: a chunk's bytes behind a header that records their checksum.

An entry is the store's frame (``snapshotter.codec``) with another magic and
a 16-byte extension, then padding, then the payload::

    offset  size  field
    0       4     magic b"THK2"
    4       1     codec  0 = raw, 1 = zstd (as the store's frame)
    5       3     reserved, zero
    8       8     raw_size_bytes, little-endian u64
    16      8     checksum: xxh3-64 of the raw (decoded) bytes, little-endian u64
    24      8     payload_offset: where the payload starts, >= 32, little-endian u64
    32            zero padding up to payload_offset
    payload_offset  payload: the raw bytes, or a zstd frame of them

The padding lets a raw entry's payload sit at the same offset within a page
as the chunk's first byte in a load's page-aligned buffer, so the loader can
map the entry's whole pages into the buffer instead of copying them
(``snapshotter.cache``). It is less than a page; a zstd entry has none.

The checksum is computed from bytes already verified against their digest
and written in the same file, so the entry and its checksum are renamed into
place together. Older thaws wrote two other formats, still read: ``THK1``
(the same header, payload always at 32), and the store's own frame (``THC1``,
16-byte header, payload at 16), which carries no checksum and is read as
untrusted (checked with its digest, then written again with one).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from snapshotter import codec
from snapshotter.errors import ChunkTooLargeError, IntegrityError

MAGIC = b"THK2"
MAGIC_PAYLOAD_AT_32 = b"THK1"
EXTENSION = struct.Struct("<QQ")  # checksum, payload_offset (THK1: reserved, zero)
HEADER_SIZE = codec.HEADER_SIZE + EXTENSION.size


@dataclass(frozen=True)
class EntryHeader:
    """What an entry's header says: ``checksum`` None for an older entry (no record)."""

    codec: codec.Codec
    header_bytes: int  # where the payload starts
    checksum: int | None


def payload_offset(
    kind: codec.Codec, raw_size: int, page_offset: int | None, page_bytes: int
) -> int:
    """Where a new entry's payload starts: at ``page_offset`` within a page (the offset
    within a page of the chunk's first byte in a load's buffer) for a raw chunk that
    covers a whole page there; else right after the header."""
    if kind is not codec.Codec.RAW or page_offset is None:
        return HEADER_SIZE
    first_whole_page = -page_offset % page_bytes  # in the chunk
    if first_whole_page + page_bytes > raw_size:
        return HEADER_SIZE
    return HEADER_SIZE + (page_offset - HEADER_SIZE) % page_bytes


def pack_header(
    kind: codec.Codec, raw_size: int, checksum: int, payload_at: int = HEADER_SIZE
) -> bytes:
    """An entry's bytes before its payload: the header, then padding to ``payload_at``."""
    if payload_at < HEADER_SIZE:
        raise ValueError(f"a payload cannot start at {payload_at}, inside the header")
    header = codec.HEADER.pack(MAGIC, kind, raw_size) + EXTENSION.pack(checksum, payload_at)
    return header + bytes(payload_at - HEADER_SIZE)


def read_header(head: bytes, declared_size: int) -> EntryHeader:
    """An entry's header from its first ``HEADER_SIZE`` bytes (fewer when it is shorter).

    Raises ``IntegrityError`` for a short or unknown header and
    ``ChunkTooLargeError`` when it claims another size than ``declared_size``.
    """
    if len(head) < codec.HEADER_SIZE:
        raise IntegrityError(f"cache entry is {len(head)} bytes, shorter than its header")
    magic, codec_id, raw_size = codec.HEADER.unpack_from(head)
    if magic not in (MAGIC, MAGIC_PAYLOAD_AT_32, codec.MAGIC):
        raise IntegrityError(f"cache entry has bad magic {magic!r}")
    if raw_size != declared_size:
        raise ChunkTooLargeError(
            f"cache entry claims {raw_size} bytes but the manifest declares {declared_size}"
        )
    try:
        kind = codec.Codec(codec_id)
    except ValueError:
        raise IntegrityError(f"cache entry names unknown codec {codec_id}") from None
    if magic == codec.MAGIC:
        return EntryHeader(kind, codec.HEADER_SIZE, None)
    if len(head) < HEADER_SIZE:
        raise IntegrityError("cache entry is truncated inside its header")
    checksum, payload_at = EXTENSION.unpack_from(head, codec.HEADER_SIZE)
    if magic == MAGIC_PAYLOAD_AT_32:
        payload_at = HEADER_SIZE
    elif payload_at < HEADER_SIZE:
        raise IntegrityError(f"cache entry puts its payload at {payload_at}, inside its header")
    return EntryHeader(kind, int(payload_at), int(checksum))


def parse(entry: bytes, declared_size: int) -> tuple[EntryHeader, memoryview]:
    """(header, payload) of a whole entry held in memory."""
    header = read_header(entry[:HEADER_SIZE], declared_size)
    return header, memoryview(entry)[header.header_bytes :]


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
