"""Setup for ``bench/image.py`` (never timed): the big image, the store, the pull blobs.

The image is the test base (Debian bookworm minbase, built with debootstrap)
plus one layer of ``blob_count`` incompressible files under ``/opt/bench``
that start-up never reads, written as a ``docker save`` archive and loaded
into the local engine. The same archive is then

- pushed to a thaw store as chunks (``thaw images push``), for the lazy rows;
- stored in the same store as ``PIECE_BYTES`` blobs under ``bench/pull/``, the
  way a registry holds layer blobs, for the pull-and-extract row.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from snapshotter.images import push_image_archive, resolve_image
from snapshotter.registry import Registry
from tests.fixtures.images import base_rootfs_tar

PIECE_BYTES = 64 << 20
BLOB_BYTES = 8 << 20
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class BenchImage:
    tag: str  # in the local engine
    ref: str  # in the thaw store
    archive: Path
    archive_bytes: int
    pull_keys: tuple[str, ...]
    files_total: int


def ensure_bench_image(data_dir: Path, size_mb: int, registry: Registry) -> BenchImage:
    """Build (once) the archive, load it, push it as chunks and as pull blobs."""
    tag = f"thaw-bench-big:{size_mb}mb"
    ref = f"bench-big:{size_mb}mb"
    archive = data_dir / f"bench-big-{size_mb}mb.tar"
    if not archive.exists():
        _write_archive(archive, tag, size_mb)
    if subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode:
        subprocess.run(
            ["docker", "load", "-q", "-i", str(archive)], check=True, capture_output=True
        )
    try:
        resolve_image(registry, ref)
    except Exception:
        with archive.open("rb") as f:
            push_image_archive(f, ref, registry)
    keys = _ensure_pull_blobs(registry, archive, ref)
    with tarfile.open(base_rootfs_tar()) as base:
        files_total = sum(1 for m in base if m.isreg()) + size_mb * (1 << 20) // BLOB_BYTES
    return BenchImage(tag, ref, archive, archive.stat().st_size, keys, files_total)


def _write_archive(archive: Path, tag: str, size_mb: int) -> None:
    archive.parent.mkdir(parents=True, exist_ok=True)
    big = archive.with_suffix(".layer.tar")
    _write_blob_layer(big, size_mb * (1 << 20) // BLOB_BYTES)
    base = archive.with_suffix(".base.tar")
    _write_unique_base(base, archive.name)
    diff_ids = [f"sha256:{_sha256(p)}" for p in (base, big)]
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": [PATH_ENV], "Cmd": ["/bin/sh"]},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }
    config_bytes = json.dumps(config).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    manifest = [{"Config": config_name, "RepoTags": [tag], "Layers": ["base.tar", "big.tar"]}]
    partial = archive.with_suffix(".partial")
    with tarfile.open(partial, "w") as tar:
        tar.add(base, "base.tar")
        tar.add(big, "big.tar")
        _add(tar, config_name, config_bytes)
        _add(tar, "manifest.json", json.dumps(manifest).encode())
    big.unlink()
    base.unlink()
    os.replace(partial, archive)


def _write_unique_base(path: Path, marker: str) -> None:
    """The test base rootfs plus a marker file: a layer the engine holds nowhere else,
    so removing the bench image before a pull trial really makes the engine extract it."""
    with tarfile.open(base_rootfs_tar()) as src, tarfile.open(path, "w") as dst:
        for member in src:
            dst.addfile(member, src.extractfile(member) if member.isreg() else None)
        _add(dst, "etc/thaw-bench-marker", marker.encode())


def _write_blob_layer(path: Path, blobs: int) -> None:
    with tarfile.open(path, "w") as tar:
        for d in ("opt", "opt/bench"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for i in range(blobs):
            _add(tar, f"opt/bench/blob-{i:04d}.bin", os.urandom(BLOB_BYTES))


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o644
    tar.addfile(info, io.BytesIO(data))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def _ensure_pull_blobs(registry: Registry, archive: Path, ref: str) -> tuple[str, ...]:
    prefix = f"bench/pull/{ref.replace(':', '-')}"
    count = (archive.stat().st_size + PIECE_BYTES - 1) // PIECE_BYTES
    keys = tuple(f"{prefix}/{i:05d}" for i in range(count))
    if all(registry.store.exists(k) for k in keys):
        return keys
    with archive.open("rb") as f:
        for key in keys:
            registry.store.put(key, f.read(PIECE_BYTES))
    return keys


def fetch_into(registry: Registry, keys: tuple[str, ...], sink: IO[bytes]) -> int:
    """Stream the pull blobs into ``sink`` (``docker load``'s stdin); return bytes."""
    total = 0
    for key in keys:
        data = registry.store.get(key)
        sink.write(data)
        total += len(data)
    return total
