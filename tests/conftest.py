"""Fixtures shared by the whole suite: real models, real S3, real stores."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from snapshotter.config import S3Config, StoreConfig
from tests.fixtures.models import build_adapter, build_llama
from tests.fixtures.s3 import create_bucket, moto_server

S3_KEYS = {"access_key_id": "test", "secret_access_key": "test", "region": "us-east-1"}


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama with several safetensors shards and an index JSON."""
    return build_llama(tmp_path_factory.mktemp("models") / "llama", seed=0)


@pytest.fixture(scope="session")
def adapter_dirs(tmp_path_factory: pytest.TempPathFactory, llama_dir: Path) -> list[Path]:
    """Two LoRA adapters (PEFT layout) of ``llama_dir``, with different weights."""
    base = tmp_path_factory.mktemp("adapters")
    return [build_adapter(llama_dir, base / f"adapter{i}", seed=10 + i) for i in range(2)]


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    with moto_server() as url:
        yield url


@pytest.fixture(params=["local", "s3"])
def store_config(request: pytest.FixtureRequest, tmp_path: Path) -> StoreConfig:
    """The same tests run against a local directory and S3 (moto server)."""
    if request.param == "local":
        return StoreConfig(url=str(tmp_path / "store"))
    endpoint = request.getfixturevalue("s3_endpoint")
    bucket = f"thaw-{uuid.uuid4().hex[:12]}"
    create_bucket(endpoint, bucket)
    return StoreConfig(
        url=f"s3://{bucket}/artifacts", s3=S3Config(endpoint_url=endpoint, **S3_KEYS)
    )
