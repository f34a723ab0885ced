"""Where this control plane's store is, told without credentials.

``thaw models push``, ``thaw deploy`` and the other commands that touch the
store ask for it (``GET /v1/store``) when the CLI is pointed at a server and
given no store of its own, so that a push lands where the server reads. A
directory is its absolute path on the server's machine; an S3 store is its
``s3://bucket/prefix`` with the endpoint and region (keys are never told).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from control_plane.settings import Settings
from snapshotter.registry import Registry


@dataclass(frozen=True)
class StoreLocation:
    url: str  # an absolute directory, or s3://bucket/prefix
    s3_endpoint_url: str | None  # S3 only; None: AWS
    s3_region: str | None  # S3 only


def of(registry: Registry, settings: Settings) -> StoreLocation:
    """The store ``registry`` opened (a directory exists once opened)."""
    url = registry.store.url
    if not url.startswith("s3://"):
        return StoreLocation(url, None, None)
    return StoreLocation(url, without_userinfo(settings.s3_endpoint_url), settings.s3_region)


def without_userinfo(url: str | None) -> str | None:
    """``url`` with any ``user:password@`` dropped."""
    if url is None:
        return None
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
