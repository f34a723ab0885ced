"""A store in an S3 bucket (AWS or any S3-compatible server), through boto3.

The URL is ``s3://bucket/prefix``; a key ``k`` lives at object ``prefix/k``
(at ``k`` when there is no prefix). A PUT is atomic in S3, so a reader never
sees a partial object. The client is shared by all threads (boto3 clients are
thread-safe) and its connection pool is sized by ``S3Config.max_pool_connections``
so that many concurrent GETs do not queue for a connection.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NoReturn

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
)

from snapshotter.config import S3Config
from snapshotter.errors import NotFoundError, StoreError
from snapshotter.stores.base import ObjectInfo, Store, check_key

_MISSING_CODES = frozenset({"404", "NoSuchKey", "NotFound"})
_CONNECT_TIMEOUT_S = 10
_READ_TIMEOUT_S = 60
_MAX_ATTEMPTS = 4


def parse_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` → ("bucket", "some/prefix"); the prefix may be empty."""
    if not url.startswith("s3://"):
        raise StoreError(f"not an S3 URL: {url!r} (expected s3://bucket/prefix)")
    bucket, _, prefix = url[len("s3://") :].partition("/")
    if not bucket:
        raise StoreError(f"S3 URL {url!r} names no bucket (expected s3://bucket/prefix)")
    return bucket, prefix.strip("/")


def has_credentials(config: S3Config) -> bool:
    """Whether ``config`` or boto3's chain (environment, profile, instance role) has keys."""
    if config.access_key_id and config.secret_access_key:
        return True
    return boto3.session.Session().get_credentials() is not None


class S3Store(Store):
    def __init__(self, url: str, config: S3Config) -> None:
        self.bucket, self.prefix = parse_s3_url(url)
        self.url = f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"
        self._client: Any = boto3.session.Session().client(
            "s3",
            endpoint_url=config.endpoint_url,
            region_name=config.region,
            aws_access_key_id=config.access_key_id,
            aws_secret_access_key=config.secret_access_key,
            config=Config(
                max_pool_connections=config.max_pool_connections,
                connect_timeout=_CONNECT_TIMEOUT_S,
                read_timeout=_READ_TIMEOUT_S,
                retries={"max_attempts": _MAX_ATTEMPTS, "mode": "standard"},
            ),
        )

    def _object(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def get(self, key: str) -> bytes:
        try:
            response = self._client.get_object(Bucket=self.bucket, Key=self._object(key))
            return bytes(response["Body"].read())
        except (ClientError, BotoCoreError) as exc:
            self._raise(exc, "read", key)

    def put(self, key: str, data: bytes | memoryview) -> None:
        try:
            self._client.put_object(Bucket=self.bucket, Key=self._object(key), Body=bytes(data))
        except (ClientError, BotoCoreError) as exc:
            self._raise(exc, "write", key)

    def exists(self, key: str) -> bool:
        try:
            self._client.head_object(Bucket=self.bucket, Key=self._object(key))
        except ClientError as exc:
            if _error_code(exc) in _MISSING_CODES:
                return False
            self._raise(exc, "check", key)
        except BotoCoreError as exc:
            self._raise(exc, "check", key)
        return True

    def delete(self, key: str) -> None:
        try:
            self._client.delete_object(Bucket=self.bucket, Key=self._object(key))
        except (ClientError, BotoCoreError) as exc:
            self._raise(exc, "delete", key)

    def list(self, prefix: str) -> Iterator[str]:
        base = f"{self.prefix}/" if self.prefix else ""
        paginator = self._client.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=base + prefix):
                for obj in page.get("Contents", []):
                    yield str(obj["Key"])[len(base) :]
        except (ClientError, BotoCoreError) as exc:
            self._raise(exc, "list", prefix or "(all keys)")

    def list_info(self, prefix: str) -> Iterator[ObjectInfo]:
        base = f"{self.prefix}/" if self.prefix else ""
        paginator = self._client.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=base + prefix):
                for obj in page.get("Contents", []):
                    key = str(obj["Key"])[len(base) :]
                    yield ObjectInfo(key, int(obj["Size"]), obj["LastModified"].timestamp())
        except (ClientError, BotoCoreError) as exc:
            self._raise(exc, "list", prefix or "(all keys)")

    def _raise(self, exc: Exception, verb: str, key: str) -> NoReturn:
        if isinstance(exc, EndpointConnectionError):
            raise StoreError(
                f"cannot {verb} {key} in {self.url}: {exc}; check THAW_S3_ENDPOINT_URL and "
                "that the S3 server is up"
            ) from exc
        if isinstance(exc, NoCredentialsError):
            raise StoreError(
                f"cannot {verb} {key} in {self.url}: no S3 credentials; set "
                "THAW_S3_ACCESS_KEY_ID and THAW_S3_SECRET_ACCESS_KEY"
            ) from exc
        code = _error_code(exc) if isinstance(exc, ClientError) else None
        if code in _MISSING_CODES:
            raise NotFoundError(f"{key} is not in store {self.url}") from None
        if code == "NoSuchBucket":
            raise StoreError(
                f"cannot {verb} {key}: bucket {self.bucket!r} does not exist; create it "
                f"or set THAW_STORE / --store to an existing s3://bucket/prefix"
            ) from exc
        if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
            raise StoreError(
                f"cannot {verb} {key} in {self.url}: access refused ({code}); check "
                "THAW_S3_ACCESS_KEY_ID / THAW_S3_SECRET_ACCESS_KEY"
            ) from exc
        raise StoreError(f"cannot {verb} {key} in store {self.url}: {exc}") from exc


def _error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))
