"""One suite, two stores: every test runs on a local directory and on S3 (moto server)."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from snapshotter.config import S3Config, StoreConfig
from snapshotter.errors import NotFoundError, StoreError
from snapshotter.stores import LocalStore, open_store
from snapshotter.stores.s3 import S3Store, parse_s3_url
from tests.conftest import S3_KEYS


def test_put_get_round_trip(store_config: StoreConfig) -> None:
    store = open_store(store_config)
    store.put("chunks/ab/abc", b"hello")
    store.put("empty", b"")
    store.put("view", memoryview(b"0123456789")[2:5])
    assert store.get("chunks/ab/abc") == b"hello"
    assert store.get("empty") == b""
    assert store.get("view") == b"234"


def test_put_replaces(store_config: StoreConfig) -> None:
    store = open_store(store_config)
    store.put("tags/m/v1", b"one")
    store.put("tags/m/v1", b"two")
    assert store.get("tags/m/v1") == b"two"


def test_missing_key_is_not_found(store_config: StoreConfig) -> None:
    store = open_store(store_config)
    with pytest.raises(NotFoundError, match="nope/x is not in store"):
        store.get("nope/x")
    assert not store.exists("nope/x")


def test_exists_and_delete(store_config: StoreConfig) -> None:
    store = open_store(store_config)
    store.put("manifests/m1", b"{}")
    assert store.exists("manifests/m1")
    store.delete("manifests/m1")
    assert not store.exists("manifests/m1")
    store.delete("manifests/m1")  # absent: not an error


def test_list_by_prefix(store_config: StoreConfig) -> None:
    store = open_store(store_config)
    for key in ("chunks/aa/1", "chunks/bb/2", "tags/m/v1", "manifests/x"):
        store.put(key, b"x")
    assert sorted(store.list("chunks/")) == ["chunks/aa/1", "chunks/bb/2"]
    assert sorted(store.list("")) == ["chunks/aa/1", "chunks/bb/2", "manifests/x", "tags/m/v1"]
    assert list(store.list("profiles/")) == []


def test_keys_escaping_the_root_refused(store_config: StoreConfig) -> None:
    store = open_store(store_config)
    for key in ("../x", "/abs", "a//b", "a/./b", ""):
        with pytest.raises(ValueError, match="invalid store key"):
            store.put(key, b"x")


def test_parallel_puts_and_gets(store_config: StoreConfig) -> None:
    store = open_store(store_config)
    keys = [f"chunks/{i:02x}/{i}" for i in range(32)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: store.put(k, k.encode() * 100), keys))
        got = list(pool.map(store.get, keys))
    assert got == [k.encode() * 100 for k in keys]


def test_open_store_picks_by_url(tmp_path: Path) -> None:
    assert isinstance(open_store(StoreConfig(url=str(tmp_path / "a"))), LocalStore)
    assert isinstance(open_store(StoreConfig(url=f"file://{tmp_path / 'b'}")), LocalStore)
    s3 = open_store(StoreConfig(url="s3://bucket/some/prefix/", s3=S3Config(**S3_KEYS)))
    assert isinstance(s3, S3Store)
    assert (s3.bucket, s3.prefix, s3.url) == ("bucket", "some/prefix", "s3://bucket/some/prefix")
    with pytest.raises(StoreError, match="unsupported store URL scheme 'gs'"):
        open_store(StoreConfig(url="gs://bucket/x"))


def test_s3_url_without_bucket_refused() -> None:
    with pytest.raises(StoreError, match="names no bucket"):
        parse_s3_url("s3:///prefix")
    assert parse_s3_url("s3://b") == ("b", "")


def test_s3_missing_bucket_is_a_clear_store_error(s3_endpoint: str) -> None:
    config = S3Config(endpoint_url=s3_endpoint, **S3_KEYS)
    store = open_store(StoreConfig(url=f"s3://absent-{uuid.uuid4().hex[:8]}/p", s3=config))
    with pytest.raises(StoreError, match="does not exist; create it"):
        store.put("k", b"x")
    with pytest.raises(StoreError, match="does not exist"):
        list(store.list(""))


def test_s3_without_prefix(s3_endpoint: str) -> None:
    from tests.fixtures.s3 import create_bucket

    bucket = f"thaw-{uuid.uuid4().hex[:12]}"
    create_bucket(s3_endpoint, bucket)
    store = open_store(
        StoreConfig(url=f"s3://{bucket}", s3=S3Config(endpoint_url=s3_endpoint, **S3_KEYS))
    )
    store.put("tags/a/b", b"d")
    assert list(store.list("tags/")) == ["tags/a/b"]
    assert store.get("tags/a/b") == b"d"


def test_s3_unreachable_endpoint_is_a_clear_store_error() -> None:
    from tests.fixtures.s3 import _free_port

    endpoint = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    config = StoreConfig(url="s3://b/p", s3=S3Config(endpoint_url=endpoint, **S3_KEYS))
    with pytest.raises(StoreError, match="check THAW_S3_ENDPOINT_URL"):
        open_store(config).get("chunks/aa/x")
