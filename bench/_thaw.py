"""thaw's side of the loader bench: push the model, open a loader, flatten its report.

Kept apart from the other methods because it follows thaw's own API
(``snapshotter.push.push_directory``, ``snapshotter.loader.Snapshotter``),
which the others do not import.

A trial spec may name ``ram_tier_dir`` (a tmpfs directory): the loader then
has the worker's host-RAM tier in front of its disk cache.

A thaw store spec (JSON, passed to trial processes) is::

    {"url": "<dir> | s3://bucket/prefix", "endpoint_url": "http://127.0.0.1:PORT" | null}
"""

from __future__ import annotations

from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench._load_setup import S3_KEYS, S3_REGION

if TYPE_CHECKING:
    from snapshotter.loader import Snapshotter
    from snapshotter.registry import Registry

BENCH_REF = "bench/llama:latest"
RAM_TIER_BYTES = 64 << 30  # the cap never binds: the bench holds one model


def store_config(store: dict[str, Any]) -> Any:
    """A ``snapshotter.config.StoreConfig`` from a store spec."""
    from snapshotter.config import S3Config, StoreConfig

    if not store.get("endpoint_url"):
        return StoreConfig(url=store["url"])
    s3 = S3Config(
        endpoint_url=store["endpoint_url"],
        region=S3_REGION,
        access_key_id=S3_KEYS["aws_access_key_id"],
        secret_access_key=S3_KEYS["aws_secret_access_key"],
    )
    return StoreConfig(url=store["url"], s3=s3)


def open_registry(store: dict[str, Any]) -> Registry:
    from snapshotter.registry import Registry
    from snapshotter.stores import open_store

    return Registry(open_store(store_config(store)))


def push_model(model_dir: str, store: dict[str, Any], ref: str = BENCH_REF) -> str:
    """Push the model directory to the store (chunks already there are skipped), as it
    is: every loader reads the same files, and each is checked against their bytes."""
    from snapshotter.push import push_directory

    return push_directory(Path(model_dir), ref, open_registry(store), convert=False).digest


def create_s3_bucket(store: dict[str, Any]) -> None:
    from bench._load_setup import s3_client

    bucket = store["url"][len("s3://") :].split("/", 1)[0]
    s3_client(store["endpoint_url"]).create_bucket(Bucket=bucket)


def open_snapshotter(spec: dict[str, Any]) -> Snapshotter:
    """A loader over the spec's store with its disk cache, built before the clock starts.

    Building it opens the store client and scans the cache directory; the
    boto3 row likewise builds its client untimed.
    """
    from snapshotter.cache import DiskCache
    from snapshotter.config import CacheConfig, LoaderConfig, RamTierConfig
    from snapshotter.loader import Snapshotter
    from snapshotter.ram_tier import RamTier

    cache = DiskCache(CacheConfig(directory=Path(spec["cache_dir"])))
    tier = None
    if spec.get("ram_tier_dir"):
        tier = RamTier(
            RamTierConfig(
                directory=Path(spec["ram_tier_dir"]),
                max_bytes=RAM_TIER_BYTES,
                pin_ahead=spec.get("pin_ahead", True),
            )
        )
    return Snapshotter(open_registry(spec["store"]), cache, LoaderConfig(), ram_tier=tier)


def report_dict(report: Any) -> dict[str, Any]:
    """The loader's ``LoadReport`` as plain JSON-able data (stages nested)."""
    if is_dataclass(report) and not isinstance(report, type):
        return asdict(report)
    raise TypeError(f"expected a LoadReport dataclass, got {type(report).__name__}")
