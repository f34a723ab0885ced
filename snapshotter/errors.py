"""Errors raised by the snapshotter.

    SnapshotterError
    ├── BadArtifactError        input refused at push: no safetensors, a pickle, a bad header
    ├── NotFoundError           no such tag, manifest or chunk in the store
    ├── IntegrityError          stored bytes do not match their digest or declared size
    │   └── ChunkTooLargeError  a chunk claims or expands past its declared size
    ├── StoreError              the store itself failed (I/O, S3)
    │   └── CacheFullError      the worker's cache disk ran out of space
    └── InvalidReferenceError   a NAME:TAG or digest that cannot be parsed

Every message says what was wrong and, where there is one, what to do.
"""

from __future__ import annotations


class SnapshotterError(Exception):
    """Base of every error the snapshotter raises."""


class BadArtifactError(SnapshotterError):
    """An artifact directory or file was refused; nothing was written to the store."""


class NotFoundError(SnapshotterError):
    """A tag, manifest or chunk is not in the store."""


class IntegrityError(SnapshotterError):
    """Bytes from a store or cache failed verification."""


class ChunkTooLargeError(IntegrityError):
    """A chunk claims, or decompresses to, more than its declared size."""


class StoreError(SnapshotterError):
    """The store could not complete an operation."""


class CacheFullError(StoreError):
    """The cache disk is full; the partial entry was removed."""


class InvalidReferenceError(SnapshotterError):
    """A reference is neither NAME:TAG nor a digest."""
