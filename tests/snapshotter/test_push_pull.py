"""Push, pull and verify against real stores (local directory and S3 via moto)."""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from snapshotter.config import StoreConfig
from snapshotter.errors import (
    BadArtifactError,
    IntegrityError,
    InvalidReferenceError,
    NotFoundError,
    SnapshotterError,
    StoreError,
)
from snapshotter.manifest import ArtifactKind, Manifest
from snapshotter.pull import pull, verify
from snapshotter.push import PushProgress, push_directory
from snapshotter.registry import Registry, chunk_key
from snapshotter.stores import open_store
from snapshotter.stores.base import Store
from tests.snapshotter.test_safetensors_header import BAD_FILES

CHUNK_BYTES = 16 << 10  # small, so the tiny model's larger tensors are split


def files_of(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def registry_of(config: StoreConfig) -> Registry:
    return Registry(open_store(config))


def stored_chunk_sizes(registry: Registry) -> dict[str, int]:
    return {d: len(registry.get_chunk(d)) for d in registry.chunk_digests()}


def test_model_push_pull_byte_identical(
    llama_dir: Path, store_config: StoreConfig, tmp_path: Path
) -> None:
    registry = registry_of(store_config)
    events: list[PushProgress] = []
    result = push_directory(
        llama_dir, "llama-tiny:v1", registry, chunk_size_bytes=CHUNK_BYTES, progress=events.append
    )
    source = files_of(llama_dir)
    assert len([p for p in source if p.endswith(".safetensors")]) > 1, "fixture is sharded"
    assert result.kind is ArtifactKind.MODEL and result.files == len(source)
    assert result.raw_size_bytes == sum(len(b) for b in source.values())
    assert result.chunks_new + result.chunks_deduplicated == result.chunks_total
    assert result.new_bytes == sum(stored_chunk_sizes(registry).values())
    assert result.stored_size_bytes == result.new_bytes
    assert registry.resolve("llama-tiny:v1") == result.digest
    assert [e.bytes_done for e in events] == sorted(e.bytes_done for e in events)
    assert events[-1].bytes_done == events[-1].bytes_total == result.raw_size_bytes
    assert events[-1].chunks_done == result.chunks_total

    manifest = registry.get_manifest(result.digest)
    big = [
        (f, t)
        for f in manifest.safetensors_files()
        for t in f.safetensors.tensors  # type: ignore[union-attr]
        if t.nbytes > CHUNK_BYTES
    ]
    assert big, "some tensor must be larger than the chunk size"
    for f, t in big:
        start = f.safetensors.data_offset + t.begin  # type: ignore[union-attr]
        assert start in {c.offset for c in f.chunks}

    pull("llama-tiny:v1", tmp_path / "out", registry)
    assert files_of(tmp_path / "out") == source


def test_adapters_push_pull_byte_identical(
    adapter_dirs: list[Path], store_config: StoreConfig, tmp_path: Path
) -> None:
    registry = registry_of(store_config)
    for i, adapter in enumerate(adapter_dirs):
        result = push_directory(adapter, f"lora-{i}:v1", registry)
        assert result.kind is ArtifactKind.ADAPTER
        out = tmp_path / f"out{i}"
        pull(f"lora-{i}:v1", out, registry)
        assert files_of(out) == files_of(adapter)
    assert [t.ref for t in registry.tags()] == ["lora-0:v1", "lora-1:v1"]


def test_push_twice_uploads_nothing_new(llama_dir: Path, store_config: StoreConfig) -> None:
    registry = registry_of(store_config)
    first = push_directory(llama_dir, "llama:v1", registry, chunk_size_bytes=CHUNK_BYTES)
    second = push_directory(llama_dir, "llama:v2", registry, chunk_size_bytes=CHUNK_BYTES)
    assert second.digest == first.digest
    assert (second.new_bytes, second.chunks_new) == (0, 0)
    assert second.dedup_bytes == second.raw_size_bytes
    assert second.chunks_deduplicated == second.chunks_total


def _sibling_model(llama_dir: Path, dest: Path) -> Path:
    """A copy of the model in which one tensor of the last shard differs."""
    shutil.copytree(llama_dir, dest)
    shard = sorted(dest.glob("*.safetensors"))[-1]
    tensors = load_file(shard)
    name = sorted(tensors)[0]
    tensors[name] = tensors[name] + 1.0
    save_file(tensors, str(shard), metadata={"format": "pt"})
    return dest


def test_two_models_sharing_tensors_store_shared_chunks_once(
    llama_dir: Path, store_config: StoreConfig, tmp_path: Path
) -> None:
    registry = registry_of(store_config)
    other = _sibling_model(llama_dir, tmp_path / "sibling")
    a = push_directory(llama_dir, "a:v1", registry, chunk_size_bytes=CHUNK_BYTES)
    b = push_directory(other, "b:v1", registry, chunk_size_bytes=CHUNK_BYTES)
    ma, mb = registry.get_manifest(a.digest), registry.get_manifest(b.digest)
    assert a.digest != b.digest

    union = ma.unique_chunks() | mb.unique_chunks()
    stored = stored_chunk_sizes(registry)
    assert set(stored) == set(union)
    assert len(stored) < len(ma.unique_chunks()) + len(mb.unique_chunks())
    assert sum(stored.values()) == sum(c.stored_size for c in union.values())

    seen, expected_dedup = set(ma.unique_chunks()), 0
    for f in mb.files:
        for c in f.chunks:
            expected_dedup += c.size if c.digest in seen else 0
            seen.add(c.digest)
    assert b.dedup_bytes == expected_dedup > b.raw_size_bytes // 2
    assert b.new_bytes == sum(stored[d] for d in set(mb.unique_chunks()) - set(ma.unique_chunks()))


class FailingStore(Store):
    """Passes through to a real store, then fails every chunk put after ``allowed`` of them."""

    def __init__(self, inner: Store, allowed: int) -> None:
        self.inner, self.url, self.allowed = inner, inner.url, allowed
        self._lock = threading.Lock()

    def put(self, key: str, data: bytes | memoryview) -> None:
        if key.startswith("chunks/"):  # the push's gc lease is written too; only chunks count
            with self._lock:
                self.allowed -= 1
                if self.allowed < 0:
                    raise StoreError(f"injected failure writing {key}")
        self.inner.put(key, data)

    def get(self, key: str) -> bytes:
        return self.inner.get(key)

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def list(self, prefix: str) -> Iterator[str]:
        return self.inner.list(prefix)


def test_interrupted_push_resumes_with_same_digest(
    llama_dir: Path, store_config: StoreConfig, tmp_path: Path
) -> None:
    store = open_store(store_config)
    with pytest.raises(StoreError, match="injected failure"):
        push_directory(
            llama_dir, "llama:v1", Registry(FailingStore(store, 5)), chunk_size_bytes=CHUNK_BYTES
        )
    registry = Registry(store)
    assert registry.tags() == [] and list(registry.manifest_digests()) == []
    assert len(list(registry.chunk_digests())) == 5

    resumed = push_directory(llama_dir, "llama:v1", registry, chunk_size_bytes=CHUNK_BYTES)
    fresh = push_directory(
        llama_dir,
        "llama:v1",
        Registry(open_store(StoreConfig(str(tmp_path / "fresh")))),
        chunk_size_bytes=CHUNK_BYTES,
    )
    assert resumed.digest == fresh.digest
    assert resumed.chunks_new == fresh.chunks_new - 5
    assert resumed.new_bytes < fresh.new_bytes and resumed.dedup_bytes > 0
    assert registry.resolve("llama:v1") == fresh.digest


def test_bundle_push_skips_pycache_and_keeps_modes(
    store_config: StoreConfig, tmp_path: Path
) -> None:
    src = tmp_path / "bundle"
    (src / "pkg" / "__pycache__").mkdir(parents=True)
    (src / "app.py").write_text("def handler(x):\n    return x\n")
    (src / "pkg" / "__init__.py").write_text("")
    (src / "pkg" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\x00compiled")
    (src / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (src / "run.sh").chmod(0o755)
    (src / "data.txt").write_bytes(b"z" * 50_000)
    registry = registry_of(store_config)
    result = push_directory(
        src, "fn-code:1", registry, kind=ArtifactKind.BUNDLE, chunk_size_bytes=CHUNK_BYTES
    )
    manifest = registry.get_manifest(result.digest)
    assert [f.path for f in manifest.files] == ["app.py", "data.txt", "pkg/__init__.py", "run.sh"]
    assert manifest.file("data.txt").chunks[0].codec == "zstd"
    assert result.stored_size_bytes < result.raw_size_bytes
    out = tmp_path / "out"
    pull("fn-code:1", out, registry)
    assert files_of(out) == files_of(src)
    assert (out / "run.sh").stat().st_mode & 0o777 == 0o755
    assert (out / "app.py").stat().st_mode & 0o777 == 0o644


def _flip_last_byte(registry: Registry, digest: str) -> None:
    key = chunk_key(digest)
    data = bytearray(registry.store.get(key))
    data[-1] ^= 0xFF
    registry.store.put(key, bytes(data))


def test_corrupt_chunk_detected_by_pull_and_verify(
    llama_dir: Path, store_config: StoreConfig, tmp_path: Path
) -> None:
    registry = registry_of(store_config)
    result = push_directory(llama_dir, "llama:v1", registry, chunk_size_bytes=CHUNK_BYTES)
    manifest = registry.get_manifest(result.digest)
    victim_file = manifest.safetensors_files()[0]
    victim = victim_file.chunks[-1].digest
    _flip_last_byte(registry, victim)

    with pytest.raises(IntegrityError) as info:
        pull("llama:v1", tmp_path / "out", registry)
    assert "llama:v1" in str(info.value) and victim in str(info.value)
    leftovers = [p.name for p in (tmp_path / "out").rglob("*") if ".thaw-" in p.name]
    assert leftovers == [], "a failed pull must not leave temp files"
    assert not (tmp_path / "out" / victim_file.path).exists()

    report = verify("llama:v1", registry)
    assert not report.ok
    assert [b.digest for b in report.bad_chunks] == [victim]
    assert report.bad_chunks[0].files == (victim_file.path,)
    assert "llama:v1" in report.bad_chunks[0].reason
    assert report.chunks_checked == len(manifest.unique_chunks())


def test_chunk_frame_claiming_another_size_is_refused(
    adapter_dirs: list[Path], store_config: StoreConfig, tmp_path: Path
) -> None:
    registry = registry_of(store_config)
    result = push_directory(adapter_dirs[0], "lora:v1", registry)
    chunk = registry.get_manifest(result.digest).files[0].chunks[0]
    data = bytearray(registry.store.get(chunk_key(chunk.digest)))
    data[8] ^= 0x01  # the frame's raw_size field
    registry.store.put(chunk_key(chunk.digest), bytes(data))
    with pytest.raises(IntegrityError, match=f"lora:v1: chunk {chunk.digest}"):
        pull("lora:v1", tmp_path / "out", registry)
    assert [b.digest for b in verify("lora:v1", registry).bad_chunks] == [chunk.digest]


def test_missing_chunk_and_corrupt_manifest_reported(
    adapter_dirs: list[Path], store_config: StoreConfig, tmp_path: Path
) -> None:
    registry = registry_of(store_config)
    result = push_directory(adapter_dirs[1], "lora:v1", registry)
    assert verify("lora:v1", registry).ok
    chunk = registry.get_manifest(result.digest).files[0].chunks[0]
    registry.store.delete(chunk_key(chunk.digest))
    report = verify("lora:v1", registry)
    assert [b.digest for b in report.bad_chunks] == [chunk.digest]
    assert "missing" in report.bad_chunks[0].reason
    with pytest.raises(NotFoundError, match=chunk.digest):
        pull("lora:v1", tmp_path / "out", registry)

    key = "manifests/" + result.digest.split(":", 1)[1]
    registry.store.put(key, registry.store.get(key) + b" ")
    report = verify("lora:v1", registry)
    assert not report.ok and report.manifest_error and "corrupt" in report.manifest_error


def test_unknown_reference_is_not_found(store_config: StoreConfig, tmp_path: Path) -> None:
    registry = registry_of(store_config)
    with pytest.raises(NotFoundError, match="thaw models push"):
        pull("nothing:here", tmp_path / "out", registry)
    with pytest.raises(NotFoundError):
        verify("nothing:here", registry)


def test_manifest_path_leaving_destination_refused(tmp_path: Path) -> None:
    registry = Registry(open_store(StoreConfig(str(tmp_path / "store"))))
    src = tmp_path / "b"
    src.mkdir()
    (src / "ok.txt").write_text("x")
    result = push_directory(src, "b:1", registry, kind=ArtifactKind.BUNDLE)
    manifest = registry.get_manifest(result.digest)
    evil = Manifest.from_json(manifest.to_json().replace(b'"ok.txt"', b'"../evil.txt"'))
    registry.set_tag("evil:1", registry.put_manifest(evil))
    with pytest.raises(BadArtifactError, match="would leave the destination"):
        pull("evil:1", tmp_path / "dest", registry)
    assert not (tmp_path / "evil.txt").exists()


# --- bad input: a clear error, and nothing written to the store --------------


def _model_dir(tmp_path: Path, weights: bytes | None = None) -> Path:
    """A minimal model directory: config.json plus one safetensors file."""
    root = tmp_path / "model"
    root.mkdir()
    (root / "config.json").write_text('{"model_type": "llama"}')
    if weights is None:
        save_file({"w": torch.ones(4)}, str(root / "model.safetensors"))
    else:
        (root / "model.safetensors").write_bytes(weights)
    return root


def _assert_refused(root: Path, config: StoreConfig, message: str, **kwargs: object) -> None:
    store = open_store(config)
    with pytest.raises(BadArtifactError, match=message):
        push_directory(root, "bad:v1", Registry(store), **kwargs)  # type: ignore[arg-type]
    assert list(store.list("")) == [], "a refused push must write nothing"


def test_directory_without_safetensors_refused(store_config: StoreConfig, tmp_path: Path) -> None:
    root = tmp_path / "m"
    root.mkdir()
    (root / "config.json").write_text("{}")
    _assert_refused(root, store_config, "holds no \\*.safetensors file.*kind 'model'")
    (root / "adapter_config.json").write_text("{}")
    _assert_refused(root, store_config, "as kind 'adapter'")


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "name", ["pytorch_model.bin", "model.pt", "x.pth", "sub/last.ckpt", "a.pkl"]
)
def test_pickle_checkpoint_refused_without_opening_it(
    store_config: StoreConfig, tmp_path: Path, name: str
) -> None:
    root = _model_dir(tmp_path)
    target = root / name
    target.parent.mkdir(parents=True, exist_ok=True)
    # A FIFO: opening it for reading would block this test until its timeout,
    # so passing proves the checkpoint was judged by name and never opened.
    os.mkfifo(target)
    _assert_refused(root, store_config, "safetensors.torch.save_file")
    _assert_refused(root, store_config, "safe_serialization=True")
    _assert_refused(root, store_config, re.escape(name))


def test_pickle_refused_even_for_a_bundle(store_config: StoreConfig, tmp_path: Path) -> None:
    root = tmp_path / "code"
    root.mkdir()
    (root / "app.py").write_text("x = 1\n")
    (root / "state.pkl").write_bytes(b"not really")
    _assert_refused(root, store_config, "pickle", kind=ArtifactKind.BUNDLE)


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_safetensors_header_refused(
    store_config: StoreConfig, tmp_path: Path, case: str
) -> None:
    content, message = BAD_FILES[case]
    root = _model_dir(tmp_path, content)
    _assert_refused(
        root, store_config, re.escape("model.safetensors: ") + ".*" + re.escape(message)
    )


def test_symlink_leaving_directory_refused(store_config: StoreConfig, tmp_path: Path) -> None:
    root = _model_dir(tmp_path)
    outside = tmp_path / "secret.json"
    outside.write_text("{}")
    (root / "tokenizer.json").symlink_to(outside)
    _assert_refused(root, store_config, "tokenizer.json is a symlink to .* outside")


def test_symlink_inside_directory_is_followed(store_config: StoreConfig, tmp_path: Path) -> None:
    root = _model_dir(tmp_path)
    (root / "alias.json").symlink_to(root / "config.json")
    registry = registry_of(store_config)
    push_directory(root, "ok:v1", registry)
    pull("ok:v1", tmp_path / "out", registry)
    assert (tmp_path / "out" / "alias.json").read_text() == '{"model_type": "llama"}'
    assert not (tmp_path / "out" / "alias.json").is_symlink()


def test_index_naming_a_missing_shard_refused(store_config: StoreConfig, tmp_path: Path) -> None:
    root = _model_dir(tmp_path)
    index = {"weight_map": {"w": "model.safetensors", "v": "model-2.safetensors"}}
    (root / "model.safetensors.index.json").write_text(json.dumps(index))
    _assert_refused(root, store_config, "maps 'v' to 'model-2.safetensors'")
    index = {"weight_map": {"nope": "model.safetensors"}}
    (root / "model.safetensors.index.json").write_text(json.dumps(index))
    _assert_refused(root, store_config, "has no such tensor")


def test_digest_reference_refused_for_push(store_config: StoreConfig, tmp_path: Path) -> None:
    root = _model_dir(tmp_path)
    store = open_store(store_config)
    with pytest.raises(InvalidReferenceError, match="NAME:TAG"):
        push_directory(root, "blake3:" + "0" * 64, Registry(store))
    assert list(store.list("")) == []


def test_pull_into_a_file_is_a_clear_error(adapter_dirs: list[Path], tmp_path: Path) -> None:
    registry = Registry(open_store(StoreConfig(str(tmp_path / "store"))))
    push_directory(adapter_dirs[0], "lora:v1", registry)
    (tmp_path / "taken").write_text("a file, not a folder")
    with pytest.raises(SnapshotterError, match=r"cannot write .*taken.*check the destination"):
        pull("lora:v1", tmp_path / "taken", registry)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_file_refused_before_writing(tmp_path: Path) -> None:
    root = _model_dir(tmp_path)
    (root / "config.json").chmod(0)
    store = open_store(StoreConfig(str(tmp_path / "store")))
    try:
        with pytest.raises(BadArtifactError, match=r"cannot read .*config\.json"):
            push_directory(root, "m:v1", Registry(store))
    finally:
        (root / "config.json").chmod(0o644)
