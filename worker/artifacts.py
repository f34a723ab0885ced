"""The replica child's access to artifacts: code bundles, model files, weights.

Everything comes from the snapshotter by manifest digest:

- ``materialize`` writes a manifest's files (all, or only the non-tensor
  ones) into a directory named by the digest, atomically: a half-written
  directory is never visible, and a second replica of the same digest
  reuses the first one's directory.
- ``load_weights`` streams a manifest's tensors onto a device through the
  snapshotter's loader and reports how long fetching and placing took.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from snapshotter.codec import decode
from snapshotter.config import CacheConfig, LoaderConfig, S3Config, StoreConfig
from snapshotter.digest import digest_bytes, hex_part
from snapshotter.errors import IntegrityError
from snapshotter.manifest import FileEntry, Manifest
from snapshotter.registry import Registry
from worker.child_protocol import StoreSpec

TENSOR_SUFFIXES = (".safetensors",)


@dataclass
class LoadedWeights:
    tensors: dict[str, Any]
    phases_ms: dict[str, float] = field(default_factory=dict)


def store_config(spec: StoreSpec) -> StoreConfig:
    s3 = S3Config(
        endpoint_url=spec.s3_endpoint_url,
        region=spec.s3_region,
        access_key_id=spec.s3_access_key_id,
        secret_access_key=spec.s3_secret_access_key,
    )
    return StoreConfig(url=spec.url, s3=s3)


def cache_config(spec: StoreSpec) -> CacheConfig:
    return CacheConfig(directory=Path(spec.cache_dir), max_bytes=spec.cache_max_bytes)


def loader_config(spec: StoreSpec) -> LoaderConfig:
    return LoaderConfig(
        chunk_size_bytes=spec.chunk_size_bytes,
        max_inflight_bytes=spec.loader_max_inflight_bytes,
        fetch_threads=spec.loader_fetch_threads,
        decode_threads=spec.loader_decode_threads,
    )


def open_registry(spec: StoreSpec) -> Registry:
    from snapshotter.stores import open_store

    return Registry(open_store(store_config(spec)))


def is_tensor_file(path: str) -> bool:
    return path.endswith(TENSOR_SUFFIXES)


def read_file(registry: Registry, entry: FileEntry) -> bytes:
    """A file's bytes, every chunk and the whole file verified against digests."""
    parts = []
    for chunk in entry.chunks:
        raw = decode(registry.get_chunk(chunk.digest), chunk.size)
        if digest_bytes(raw) != chunk.digest:
            raise IntegrityError(f"chunk {chunk.digest} of {entry.path} does not match its digest")
        parts.append(raw)
    data = b"".join(parts)
    if digest_bytes(data) != entry.digest:
        raise IntegrityError(f"file {entry.path} does not match its digest {entry.digest}")
    return data


def materialize(
    registry: Registry, digest: str, root: Path, *, include_tensors: bool = False
) -> Path:
    """Write the manifest's files under ``root/<hex>[-files]``; return that directory.

    Idempotent and safe against concurrent callers: the directory is built
    under a temporary name and renamed into place; the loser of a race
    discards its copy.
    """
    dest = root / (hex_part(digest) + ("" if include_tensors else "-files"))
    if dest.is_dir():
        return dest
    root.mkdir(parents=True, exist_ok=True)
    manifest = registry.get_manifest(digest)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    try:
        for entry in manifest.files:
            if not include_tensors and is_tensor_file(entry.path):
                continue
            _write_entry(registry, entry, tmp)
        try:
            os.rename(tmp, dest)
        except OSError:
            if not dest.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _write_entry(registry: Registry, entry: FileEntry, root: Path) -> None:
    target = (root / entry.path).resolve()
    if not target.is_relative_to(root.resolve()):
        raise IntegrityError(f"manifest file path {entry.path!r} escapes its directory")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(read_file(registry, entry))
    os.chmod(target, entry.mode & 0o755)


def read_json_file(registry: Registry, manifest: Manifest, path: str) -> dict[str, Any]:
    """A small JSON file of a manifest (``config.json``), or ``{}`` when absent."""
    try:
        entry = manifest.file(path)
    except KeyError:
        return {}
    doc = json.loads(read_file(registry, entry))
    if not isinstance(doc, dict):
        raise IntegrityError(f"{path} holds a {type(doc).__name__}, expected a JSON object")
    return doc


def load_weights(registry: Registry, spec: StoreSpec, digest: str, device: str) -> LoadedWeights:
    """Every tensor of the manifest, on ``device``, with fetch and placement times."""
    from snapshotter import Snapshotter
    from snapshotter.cache import DiskCache

    snap = Snapshotter(registry, DiskCache(cache_config(spec)), loader_config(spec))
    t0 = time.perf_counter()
    tensors = snap.load(digest, device)
    total_ms = (time.perf_counter() - t0) * 1000
    return LoadedWeights(dict(tensors), _weights_phases(getattr(tensors, "report", None), total_ms))


def _weights_phases(report: Any, total_ms: float) -> dict[str, float]:
    """Split the loader's time into fetch and to-device, per its report when it has one."""
    fetch_ms = _report_ms(report, ("fetch_ms", "fetch_s"))
    if fetch_ms is None:
        return {"weights_fetch": total_ms, "weights_to_device": 0.0}
    fetch_ms = min(fetch_ms, total_ms)
    return {"weights_fetch": fetch_ms, "weights_to_device": total_ms - fetch_ms}


def _report_ms(report: Any, names: tuple[str, ...]) -> float | None:
    for name in names:
        value = getattr(report, name, None)
        if isinstance(value, int | float):
            return float(value) * (1000.0 if name.endswith("_s") else 1.0)
    return None
