"""Stores: where chunks and manifests live. ``open_store`` picks one from a URL.

* a directory path (or ``file://`` URL) → ``LocalStore``
* ``s3://bucket/prefix`` → ``S3Store`` (boto3 is imported only then)
"""

from __future__ import annotations

from snapshotter.config import StoreConfig
from snapshotter.errors import StoreError
from snapshotter.stores.base import Store
from snapshotter.stores.local import LocalStore

__all__ = ["LocalStore", "Store", "open_store"]


def open_store(config: StoreConfig) -> Store:
    """The store ``config.url`` names. Raises ``StoreError`` for an unknown scheme."""
    url = config.url.strip()
    if not url:
        raise StoreError("no store given; set THAW_STORE or pass --store DIR|s3://bucket/prefix")
    if url.startswith("s3://"):
        from snapshotter.stores.s3 import S3Store

        return S3Store(url, config.s3)
    if url.startswith("file://"):
        return LocalStore(url[len("file://") :])
    if "://" in url:
        scheme = url.split("://", 1)[0]
        raise StoreError(
            f"unsupported store URL scheme {scheme!r} in {url!r}; use a directory or "
            "s3://bucket/prefix"
        )
    return LocalStore(url)
