"""Push: a model, adapter or code bundle directory into a registry.

Order of work, which is what makes a push safe to interrupt and resume::

    1. parse NAME:TAG, inspect the directory (pickles, symlinks, headers,
       index) and plan every chunk            — nothing written yet
    2. per chunk, in a thread pool: digest (blake3) → frame (zstd if it
       saves ≥ 10%) → upload unless the store already holds that digest
    3. the manifest, unless already stored
    4. re-check that the chunks found already stored (not uploaded) are still
       there: a concurrent garbage collection may have swept them (see
       ``snapshotter.gc``); if one is gone, fail with "push again"
    5. the tag, last

Before step 1's plan, a Hugging Face model whose checkpoint transformers converts as it
loads (a mixture of experts saved apart) is written once in the model's own form into a
scratch directory, and that is pushed (``snapshotter.hf_convert``; ``convert=False``
pushes the directory as it is). The manifest's annotations say so.

A push that dies in step 2 leaves only whole chunks behind (stores write
atomically); pushing again skips them and yields the same manifest digest,
because the manifest depends only on the directory's bytes and the chunk size.

Every chunk is framed even when it is already stored, so its ``stored_size``
and codec in the manifest are known without reading the store back; framing is
deterministic for a given zstandard version.

The progress callback is called from the calling thread only.
"""

from __future__ import annotations

import tempfile
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from snapshotter import codec
from snapshotter.artifact_dir import ArtifactDir, SourceFile, inspect_directory
from snapshotter.chunking import Span, plan_chunks
from snapshotter.digest import Hasher, digest_bytes, hex_part
from snapshotter.errors import BadArtifactError, InvalidReferenceError
from snapshotter.hf_convert import CONVERTED_ANNOTATION, ConvertProgress, converted_checkpoint
from snapshotter.leases import DEFAULT_LEASE_TTL_S, LeaseKeeper, confirm_stored
from snapshotter.manifest import (
    DEFAULT_CHUNK_SIZE_BYTES,
    ArtifactKind,
    ChunkRef,
    FileEntry,
    Manifest,
)
from snapshotter.registry import Reference, Registry

DEFAULT_PUSH_THREADS = 8


@dataclass(frozen=True)
class PushProgress:
    bytes_done: int
    bytes_total: int
    chunks_done: int
    chunks_total: int
    chunks_deduplicated: int


@dataclass(frozen=True)
class PushResult:
    """What a push did. ``new_bytes`` are stored (framed) bytes uploaded;
    ``dedup_bytes`` are raw bytes not uploaded because an identical chunk was
    already in the store or earlier in this push."""

    ref: str
    digest: str
    kind: ArtifactKind
    files: int
    raw_size_bytes: int
    stored_size_bytes: int
    new_bytes: int
    dedup_bytes: int
    chunks_total: int
    chunks_new: int
    chunks_deduplicated: int
    converted: str | None = None  # how the checkpoint was converted first (``hf_convert``)


ProgressFn = Callable[[PushProgress], None]


def push_directory(
    path: str | Path,
    ref: str | Reference,
    registry: Registry,
    *,
    kind: ArtifactKind | None = None,
    chunk_size_bytes: int = DEFAULT_CHUNK_SIZE_BYTES,
    progress: ProgressFn | None = None,
    threads: int = DEFAULT_PUSH_THREADS,
    annotations: Mapping[str, str] | None = None,
    lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
    convert: bool = True,
    convert_progress: ConvertProgress | None = None,
) -> PushResult:
    """Push the directory at ``path`` and tag it ``ref`` (NAME:TAG).

    ``kind`` defaults to adapter when ``adapter_config.json`` is present, else
    model. Raises ``BadArtifactError`` (nothing written) for refused input and
    ``StoreError`` if the store fails (whole chunks may remain; push again).
    A lease (``snapshotter.leases``) protects the chunks found already stored
    and the manifest from a concurrent ``thaw gc``; chunks it uploads are
    protected by GC's grace period. ``convert``: a model checkpoint in an older form is
    pushed as its model class holds it (see the module docstring), showing
    ``convert_progress(bytes read, of all)`` as it goes.
    """
    reference = ref if isinstance(ref, Reference) else Reference.parse(str(ref))
    if reference.digest:
        raise InvalidReferenceError(f"push needs NAME:TAG, not a digest ({reference})")
    if chunk_size_bytes <= 0:
        raise ValueError(f"chunk_size_bytes must be positive, got {chunk_size_bytes}")
    artifact = inspect_directory(Path(path), kind)
    with tempfile.TemporaryDirectory(prefix="thaw-convert-") as scratch:
        notes = dict(annotations or {})
        if convert and artifact.kind is ArtifactKind.MODEL:
            into = Path(scratch) / artifact.root.name
            conversion = converted_checkpoint(artifact.root, into, progress=convert_progress)
            if conversion is not None:
                artifact = inspect_directory(into, artifact.kind)
                notes[CONVERTED_ANNOTATION] = conversion.note
        return _push(
            artifact,
            reference,
            registry,
            chunk_size_bytes,
            progress,
            threads,
            notes,
            lease_ttl_s,
        )


def _push(
    artifact: ArtifactDir,
    reference: Reference,
    registry: Registry,
    chunk_size_bytes: int,
    progress: ProgressFn | None,
    threads: int,
    annotations: dict[str, str],
    lease_ttl_s: float,
) -> PushResult:
    plans = [(f, _plan(f, chunk_size_bytes)) for f in artifact.files]
    with LeaseKeeper(registry.store, f"push {reference}", ttl_s=lease_ttl_s) as lease:
        uploader = _Uploader(registry, artifact, sum(len(s) for _, s in plans), progress, lease)
        with ThreadPoolExecutor(max(1, threads), thread_name_prefix="thaw-push") as pool:
            entries = tuple(uploader.push_file(pool, f, spans, 2 * threads) for f, spans in plans)
        manifest = Manifest(
            kind=artifact.kind,
            files=entries,
            chunk_size_bytes=chunk_size_bytes,
            annotations=annotations,
        )
        digest = manifest.digest
        lease.protect(manifests=[digest])
        if not registry.store.exists(f"manifests/{hex_part(digest)}"):
            registry.put_manifest(manifest)
        uploader.recheck_found()
        registry.set_tag(reference, digest)
    return uploader.result(str(reference), digest, manifest)


def _plan(f: SourceFile, chunk_size_bytes: int) -> list[Span]:
    if f.safetensors is None:
        return plan_chunks(f.size_bytes, chunk_size_bytes)
    return plan_chunks(
        f.size_bytes,
        chunk_size_bytes,
        data_offset=f.safetensors.data_offset,
        tensors=f.safetensors.tensors,
    )


@dataclass(frozen=True)
class _Outcome:
    digest: str
    stored_size: int
    codec: str
    uploaded: bool


@dataclass
class _Tally:
    bytes_done: int = 0
    chunks_done: int = 0
    chunks_new: int = 0
    chunks_dedup: int = 0
    new_bytes: int = 0
    dedup_bytes: int = 0
    claimed: set[str] = field(default_factory=set)


class _Uploader:
    """Chunk work shared by the pool's threads; counters touched by the caller only."""

    def __init__(
        self,
        registry: Registry,
        artifact: ArtifactDir,
        chunks_total: int,
        progress: ProgressFn | None,
        lease: LeaseKeeper,
    ) -> None:
        self._registry = registry
        self._lease = lease
        self._found: set[str] = set()  # already stored, not uploaded: re-checked at the end
        self._bytes_total = artifact.size_bytes
        self._chunks_total = chunks_total
        self._progress = progress
        self._lock = threading.Lock()
        self._tally = _Tally()

    def push_file(
        self, pool: ThreadPoolExecutor, f: SourceFile, spans: list[Span], window: int
    ) -> FileEntry:
        """Read ``f`` span by span, keep at most ``window`` chunks in flight."""
        hasher = Hasher()
        pending: deque[tuple[Span, Future[_Outcome]]] = deque()
        refs: list[ChunkRef] = []
        try:
            for span, raw in _read_spans(f, spans):
                hasher.update(raw)
                pending.append((span, pool.submit(self._process, raw)))
                while len(pending) >= window:
                    refs.append(self._collect(*pending.popleft()))
            while pending:
                refs.append(self._collect(*pending.popleft()))
        except BaseException:
            for _, future in pending:
                future.cancel()
            raise
        return FileEntry(
            path=f.rel_path,
            size=f.size_bytes,
            digest=hasher.digest(),
            chunks=tuple(refs),
            mode=f.mode,
            safetensors=f.safetensors,
        )

    def _process(self, raw: bytes) -> _Outcome:
        """Runs in a pool thread: blake3 and zstd release the GIL."""
        digest = digest_bytes(raw)
        framed, used = codec.encode(raw)
        with self._lock:
            first = digest not in self._tally.claimed
            self._tally.claimed.add(digest)
        if not first:
            return _Outcome(digest, len(framed), used.label, False)
        self._lease.add(chunks=[digest])
        uploaded = not self._registry.has_chunk(digest)
        if uploaded:
            self._registry.put_chunk(digest, framed)
        else:
            with self._lock:
                self._found.add(digest)
        return _Outcome(digest, len(framed), used.label, uploaded)

    def recheck_found(self) -> None:
        """Raise ``StoreError`` if a chunk found already stored has since been deleted."""
        registry = self._registry
        confirm_stored(self._lease, self._found, registry.has_chunk, registry.store.url)

    def _collect(self, span: Span, future: Future[_Outcome]) -> ChunkRef:
        out = future.result()
        t = self._tally
        t.bytes_done += span.size
        t.chunks_done += 1
        if out.uploaded:
            t.chunks_new += 1
            t.new_bytes += out.stored_size
        else:
            t.chunks_dedup += 1
            t.dedup_bytes += span.size
        if self._progress is not None:
            done = PushProgress(
                t.bytes_done, self._bytes_total, t.chunks_done, self._chunks_total, t.chunks_dedup
            )
            self._progress(done)
        return ChunkRef(out.digest, span.offset, span.size, out.stored_size, out.codec)

    def result(self, ref: str, digest: str, manifest: Manifest) -> PushResult:
        t = self._tally
        return PushResult(
            ref=ref,
            digest=digest,
            kind=manifest.kind,
            files=len(manifest.files),
            raw_size_bytes=manifest.raw_size,
            stored_size_bytes=manifest.stored_size,
            new_bytes=t.new_bytes,
            dedup_bytes=t.dedup_bytes,
            chunks_total=t.chunks_done,
            chunks_new=t.chunks_new,
            chunks_deduplicated=t.chunks_dedup,
            converted=manifest.annotations.get(CONVERTED_ANNOTATION),
        )


def _read_spans(f: SourceFile, spans: list[Span]) -> Iterator[tuple[Span, bytes]]:
    try:
        with f.source.open("rb") as handle:
            for span in spans:
                yield span, _read_exact(handle, span, f.rel_path)
            if handle.read(1):
                raise BadArtifactError(f"{f.rel_path} grew while it was pushed; push again")
    except OSError as exc:
        raise BadArtifactError(f"cannot read {f.rel_path}: {exc}") from exc


def _read_exact(handle: BinaryIO, span: Span, rel_path: str) -> bytes:
    handle.seek(span.offset)
    data = handle.read(span.size)
    if len(data) != span.size:
        raise BadArtifactError(f"{rel_path} shrank while it was pushed; push again")
    return data
