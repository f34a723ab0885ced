"""Pull an artifact into a directory, and verify one in place.

``pull`` writes byte-identical files. Every chunk is decoded with the size the
manifest declares as a cap and checked against its digest before its bytes are
written; each file is written to a hidden temp name in its final folder,
checked against the manifest's whole-file digest, fsynced, then renamed, so a
failed pull never leaves a partial file under a real name.

``verify`` reads the manifest (its digest is checked by the registry) and
every distinct chunk once, and reports each bad one with the files that use
it. It does not stop at the first bad chunk.

Manifest paths are checked to stay inside the destination: a hostile manifest
cannot write elsewhere.
"""

from __future__ import annotations

import os
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from snapshotter import codec
from snapshotter.digest import Hasher, digest_bytes
from snapshotter.errors import BadArtifactError, IntegrityError, NotFoundError, SnapshotterError
from snapshotter.manifest import ChunkRef, FileEntry, Manifest
from snapshotter.registry import Reference, Registry

DEFAULT_PULL_THREADS = 16


@dataclass(frozen=True)
class PullProgress:
    bytes_done: int
    bytes_total: int
    chunks_done: int
    chunks_total: int


@dataclass(frozen=True)
class PullResult:
    ref: str
    digest: str
    files: int
    raw_size_bytes: int


@dataclass(frozen=True)
class BadChunk:
    digest: str
    files: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class VerifyReport:
    """``ok`` when the manifest and every chunk verified."""

    ref: str
    digest: str
    chunks_checked: int
    bytes_checked: int
    bad_chunks: tuple[BadChunk, ...] = ()
    manifest_error: str | None = None

    @property
    def ok(self) -> bool:
        return not self.bad_chunks and self.manifest_error is None


PullProgressFn = Callable[[PullProgress], None]


def fetch_chunk(registry: Registry, chunk: ChunkRef, ref: str) -> bytes:
    """The raw bytes of ``chunk``, decoded (capped) and verified against its digest.

    Raises ``IntegrityError`` or ``NotFoundError`` naming ``ref`` and the chunk.
    """
    try:
        obj = registry.get_chunk(chunk.digest)
    except NotFoundError:
        raise NotFoundError(
            f"{ref}: chunk {chunk.digest} is missing from store {registry.store.url}; "
            "push the artifact again"
        ) from None
    try:
        raw = codec.decode(obj, chunk.size)
    except IntegrityError as exc:
        raise type(exc)(f"{ref}: chunk {chunk.digest} is corrupt: {exc}") from None
    actual = digest_bytes(raw)
    if actual != chunk.digest:
        raise IntegrityError(
            f"{ref}: chunk {chunk.digest} is corrupt in store {registry.store.url} "
            f"(its bytes hash to {actual}); run `thaw models verify {ref} --delete-bad`, "
            "then push the artifact again"
        )
    return raw


def pull(
    ref: str | Reference,
    dest_dir: str | Path,
    registry: Registry,
    *,
    progress: PullProgressFn | None = None,
    threads: int = DEFAULT_PULL_THREADS,
) -> PullResult:
    """Write the files of ``ref`` under ``dest_dir`` (created if needed).

    Existing files of the same names are replaced; others are left alone.
    On failure no file of the artifact is left half-written.
    """
    label = str(ref)
    digest = registry.resolve(ref)
    manifest = registry.get_manifest(digest)
    dest = Path(dest_dir)
    targets = [(_target(dest, f), f) for f in manifest.files]
    counter = _Counter(manifest, progress)
    with ThreadPoolExecutor(max(1, threads), thread_name_prefix="thaw-pull") as pool:
        for target, entry in targets:
            try:
                _write_file(pool, registry, label, target, entry, counter, 2 * threads)
            except OSError as exc:
                raise SnapshotterError(
                    f"cannot write {target}: {exc.strerror or exc}; check the destination"
                ) from exc
    return PullResult(label, digest, len(manifest.files), manifest.raw_size)


def _target(dest: Path, entry: FileEntry) -> Path:
    rel = PurePosixPath(entry.path)
    if rel.is_absolute() or not rel.parts or any(p in ("", ".", "..") for p in rel.parts):
        raise BadArtifactError(f"manifest path {entry.path!r} would leave the destination")
    return dest.joinpath(*rel.parts)


class _Counter:
    def __init__(self, manifest: Manifest, progress: PullProgressFn | None) -> None:
        self.total_bytes = manifest.raw_size
        self.total_chunks = sum(len(f.chunks) for f in manifest.files)
        self.bytes_done = 0
        self.chunks_done = 0
        self._progress = progress

    def add(self, size: int) -> None:
        self.bytes_done += size
        self.chunks_done += 1
        if self._progress is not None:
            self._progress(
                PullProgress(self.bytes_done, self.total_bytes, self.chunks_done, self.total_chunks)
            )


def _write_file(
    pool: ThreadPoolExecutor,
    registry: Registry,
    label: str,
    target: Path,
    entry: FileEntry,
    counter: _Counter,
    window: int,
) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.thaw-{uuid.uuid4().hex[:8]}")
    pending: deque[Future[bytes]] = deque()
    hasher = Hasher()
    try:
        with tmp.open("wb") as out:
            for chunk in entry.chunks:
                pending.append(pool.submit(fetch_chunk, registry, chunk, label))
                while len(pending) >= window:
                    _drain_one(pending, out, hasher, counter)
            while pending:
                _drain_one(pending, out, hasher, counter)
            out.flush()
            os.fsync(out.fileno())
        _check_whole_file(label, entry, tmp, hasher)
        tmp.chmod(entry.mode & 0o777)
        os.replace(tmp, target)
    except BaseException:
        for future in pending:
            future.cancel()
        tmp.unlink(missing_ok=True)
        raise


def _drain_one(
    pending: deque[Future[bytes]], out: BinaryIO, hasher: Hasher, counter: _Counter
) -> None:
    raw = pending.popleft().result()
    out.write(raw)
    hasher.update(raw)
    counter.add(len(raw))


def _check_whole_file(label: str, entry: FileEntry, tmp: Path, hasher: Hasher) -> None:
    size = tmp.stat().st_size
    if size != entry.size or hasher.digest() != entry.digest:
        raise IntegrityError(
            f"{label}: file {entry.path} assembled to {size} bytes with digest "
            f"{hasher.digest()}, but the manifest says {entry.size} bytes, {entry.digest}"
        )


def verify(
    ref: str | Reference, registry: Registry, *, threads: int = DEFAULT_PULL_THREADS
) -> VerifyReport:
    """Check the manifest of ``ref`` and every distinct chunk (digest and declared size).

    Raises ``NotFoundError`` only when the reference itself is unknown; every
    corruption is reported, not raised.
    """
    label = str(ref)
    digest = registry.resolve(ref)
    try:
        manifest = registry.get_manifest(digest)
    except (IntegrityError, NotFoundError) as exc:
        return VerifyReport(label, digest, 0, 0, manifest_error=f"{label}: {exc}")
    users: dict[str, list[str]] = {}
    for f in manifest.files:
        for c in f.chunks:
            users.setdefault(c.digest, []).append(f.path)
    chunks = list(manifest.unique_chunks().values())
    with ThreadPoolExecutor(max(1, threads), thread_name_prefix="thaw-verify") as pool:
        problems = list(pool.map(lambda c: _check_chunk(registry, c, label), chunks))
    bad = tuple(
        BadChunk(c.digest, tuple(dict.fromkeys(users[c.digest])), reason)
        for c, reason in zip(chunks, problems, strict=True)
        if reason is not None
    )
    return VerifyReport(label, digest, len(chunks), sum(c.size for c in chunks), bad)


def _check_chunk(registry: Registry, chunk: ChunkRef, label: str) -> str | None:
    try:
        fetch_chunk(registry, chunk, label)
    except (IntegrityError, NotFoundError) as exc:
        return str(exc)
    return None
