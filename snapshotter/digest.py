"""Content digests (``blake3:<64 hex>``) and node checksums (xxh3-64) of raw bytes.

Two checks, for two kinds of trust::

    store ──(digest: blake3)──▶ node tiers ──(checksum: xxh3)──▶ tensors
                                disk cache, RAM tier

A **digest** names a chunk everywhere and is checked where bytes cross into
the node from the store: it proves the bytes are the content the manifest
names, whoever wrote them. BLAKE3 hashes a few GB/s per core and releases
the GIL.

A **checksum** is recorded by a node's own tier when it writes verified
bytes (in the disk cache's entry header, in the RAM tier's ``meta.json``)
and checked on every read from that tier: it catches a flipped or lost byte
on the local disk or in ``/dev/shm`` at a small fraction of a copy's cost
(xxh3 runs at memory bandwidth; it releases the GIL above 64 KiB). It is not
a content address and proves nothing about bytes from elsewhere: bytes with
no recorded checksum are checked with their digest. ``thaw cache verify``
re-checks the tiers with the digests.
"""

from __future__ import annotations

import re

import blake3
import xxhash

ALGORITHM = "blake3"
_DIGEST_RE = re.compile(r"^blake3:[0-9a-f]{64}$")
# Below this size threading costs more than it saves.
_MULTITHREAD_MIN_BYTES = 4 << 20


def digest_bytes(data: bytes | bytearray | memoryview) -> str:
    """Digest of ``data`` as ``blake3:<hex>``."""
    threads = blake3.blake3.AUTO if len(data) >= _MULTITHREAD_MIN_BYTES else 1
    return f"{ALGORITHM}:{blake3.blake3(data, max_threads=threads).hexdigest()}"


def is_digest(text: str) -> bool:
    return bool(_DIGEST_RE.match(text))


def hex_part(digest: str) -> str:
    """The hex half of a digest, used in store keys."""
    if not is_digest(digest):
        raise ValueError(f"not a digest: {digest!r} (expected blake3:<64 hex digits>)")
    return digest.split(":", 1)[1]


class Hasher:
    """Incremental digest, for whole-file digests computed while streaming."""

    def __init__(self) -> None:
        self._h = blake3.blake3(max_threads=blake3.blake3.AUTO)

    def update(self, data: bytes | bytearray | memoryview) -> None:
        self._h.update(data)

    def digest(self) -> str:
        return f"{ALGORITHM}:{self._h.hexdigest()}"


def checksum_bytes(data: bytes | bytearray | memoryview) -> int:
    """The node checksum of ``data``: xxh3-64 as an unsigned int."""
    return xxhash.xxh3_64_intdigest(data)


class Checksummer:
    """Incremental ``checksum_bytes``: the same value for the same bytes in any pieces."""

    def __init__(self) -> None:
        self._h = xxhash.xxh3_64()

    def update(self, data: bytes | bytearray | memoryview) -> None:
        self._h.update(data)

    def checksum(self) -> int:
        return self._h.intdigest()
