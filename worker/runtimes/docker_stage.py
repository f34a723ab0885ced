"""Before a container starts: put what its replica will read where it can read it.

A replica container may have no network, so it cannot reach an S3 store.
The worker therefore stages, on the host, everything the replica child
will ask for:

- the code bundle and the model's non-tensor files, materialized by digest
  under ``bundles_dir`` (the child finds them and skips the store);
- every chunk and the manifest of the model and adapters, in the worker's
  disk chunk cache (the container mounts it read-only; its loader hits there
  and never needs to write);
- for a non-local store, a local mirror holding the manifests and the
  chunks of small non-tensor files (``adapter_config.json``), which the
  child reads through its registry. The replica's ``StoreSpec`` then names
  the mirror.

With a local store the container reads the store itself (read-only), and
only the cache is filled. Staging is idempotent; what is present is skipped.
"""

from __future__ import annotations

from pathlib import Path

from snapshotter.cache import DiskCache
from snapshotter.config import StoreConfig
from snapshotter.manifest import Manifest
from snapshotter.registry import Registry
from snapshotter.source import ChunkSource
from snapshotter.stores import open_store
from worker.artifacts import cache_config, is_tensor_file, materialize
from worker.child_protocol import ReplicaSpec, StoreSpec


def is_local(spec: StoreSpec) -> bool:
    return "://" not in spec.url or spec.url.startswith("file://")


def mirror_spec(spec: StoreSpec, mirror_dir: Path) -> StoreSpec:
    """The replica's view of the store when the real one is remote."""
    return spec.model_copy(
        update={
            "url": str(mirror_dir),
            "s3_endpoint_url": None,
            "s3_region": None,
            "s3_access_key_id": None,
            "s3_secret_access_key": None,
        }
    )


def stage_artifacts(registry: Registry, spec: ReplicaSpec, store: StoreSpec) -> int:
    """Stage the replica's bundle, model files and weights; return bytes fetched."""
    bundles = Path(store.bundles_dir)
    if spec.bundle_digest:
        materialize(registry, spec.bundle_digest, bundles, include_tensors=True)
    digests = [d for d in [spec.model_digest, *(a.digest for a in spec.adapters)] if d]
    if spec.model_digest:
        materialize(registry, spec.model_digest, bundles / "models")
    source = ChunkSource(registry, DiskCache(cache_config(store)))
    fetched = 0
    mirror = None if is_local(store) else Registry(open_store(StoreConfig(mirror_dir(store))))
    for digest in digests:
        manifest = registry.get_manifest(digest)
        fetched += _fill_cache(source, manifest)
        if source.cache is not None and source.cache.get_manifest(digest) is None:
            source.cache.put_manifest(digest, manifest.to_json())  # the loader looks here first
        if mirror is not None:
            _mirror(registry, mirror, manifest, digest)
    if mirror is not None and spec.bundle_digest:
        _mirror(registry, mirror, registry.get_manifest(spec.bundle_digest), spec.bundle_digest)
    return fetched


def mirror_dir(store: StoreSpec) -> str:
    return str(Path(store.bundles_dir) / "mirror")


def _fill_cache(source: ChunkSource, manifest: Manifest) -> int:
    assert source.cache is not None
    fetched = 0
    for digest, chunk in manifest.unique_chunks().items():
        if digest in source.cache:
            continue
        buf = bytearray(chunk.size)
        source.load_into(chunk, memoryview(buf))  # verified, written through to the cache
        fetched += chunk.size
    return fetched


def _mirror(registry: Registry, mirror: Registry, manifest: Manifest, digest: str) -> None:
    if not mirror.store.exists(f"manifests/{digest.split(':', 1)[1]}"):
        mirror.put_manifest(manifest)
    for f in manifest.files:
        if is_tensor_file(f.path):
            continue  # tensors come from the cache
        for chunk in f.chunks:
            if not mirror.has_chunk(chunk.digest):
                mirror.put_chunk(chunk.digest, registry.get_chunk(chunk.digest))
