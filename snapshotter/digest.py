"""Content digests: ``blake3:<64 hex>`` of raw (uncompressed) bytes.

BLAKE3 is used because it hashes several GB/s per core and releases the GIL,
so verification never becomes the loader's bottleneck.
"""

from __future__ import annotations

import re

import blake3

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
