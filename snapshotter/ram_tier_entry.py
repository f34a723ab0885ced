"""One entry of the RAM tier on its tmpfs: written whole, then renamed into place.

See ``snapshotter.ram_tier`` for the layout and the contracts; this module
is the entry's file format (``meta.json`` + one ``<i>.data`` per file) and
the I/O on it, with no policy.

``meta.json`` records, for each data file, the checksum (xxh3,
``snapshotter.digest``) of every piece of ``piece_bytes`` of the bytes written
(format 3), so a read checks its pieces at once on every CPU and a copy to a
device can start with the first piece checked. Format 2 (older thaw) recorded
one checksum per file: a one-piece file. Format 1 recorded a blake3 digest per
file instead: such a file's bytes are checked with that digest, and its
entry's ``meta.json`` is then written again in format 3.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import shutil
import time
import uuid
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from snapshotter.digest import checksum_bytes, digest_bytes
from snapshotter.fanout import run_each
from snapshotter.pages import populate_read

FORMAT = 3
_ONE_PIECE_FORMAT = 2  # one checksum per file
_OLD_FORMAT = 1  # blake3 digests instead of checksums
TMP_PREFIX = ".tmp-"
TRASH_PREFIX = ".trash-"
# Data files are checksummed in pieces of this size (a multiple of any page size);
# device buffers are written through host pieces of it.
PIECE_BYTES = 32 << 20


@dataclass(frozen=True)
class TierFile:
    """One data region held: the loader's buffer for ``path``."""

    path: str
    data_bytes: int
    checksums: tuple[int, ...] | None  # xxh3 of each piece of the region as written
    piece_bytes: int = PIECE_BYTES
    old_digest: str | None = None  # format 1 only (no checksums): blake3 of the same bytes

    def pieces(self) -> list[tuple[int, int]]:
        """The ``[begin, end)`` byte ranges checksummed one each, in order."""
        step = max(self.piece_bytes, 1)
        return [(b, min(b + step, self.data_bytes)) for b in range(0, self.data_bytes, step)]


class FileShape(Protocol):
    """What ``get``/``put`` need of a file plan (``snapshotter.load_plan.FilePlan``)."""

    @property
    def path(self) -> str: ...

    @property
    def data_bytes(self) -> int: ...


class BadEntry(Exception):
    """An entry's meta.json or a data file's size is wrong: the entry is corrupt."""


def read_meta(entry: Path) -> list[TierFile] | None:
    """The entry's files; None when there is no such entry; ``BadEntry`` when unreadable."""
    try:
        doc = json.loads((entry / "meta.json").read_bytes())
        if doc["format"] == _OLD_FORMAT:
            return [
                TierFile(f["path"], int(f["data_bytes"]), None, old_digest=str(f["digest"]))
                for f in doc["files"]
            ]
        if doc["format"] == _ONE_PIECE_FORMAT:
            return [
                TierFile(f["path"], n, (int(f["xxh3"], 16),), piece_bytes=n)
                for f in doc["files"]
                for n in [int(f["data_bytes"])]
            ]
        if doc["format"] != FORMAT:
            raise ValueError(f"format {doc['format']}, expected {FORMAT}")
        files = [
            TierFile(
                f["path"],
                int(f["data_bytes"]),
                tuple(int(c, 16) for c in f["xxh3"]),
                piece_bytes=int(f["piece_bytes"]),
            )
            for f in doc["files"]
        ]
        for f in files:
            if f.piece_bytes <= 0 or len(f.pieces()) != len(f.checksums or ()):
                raise ValueError(f"{f.path}: {len(f.checksums or ())} checksums for its pieces")
        return files
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BadEntry(f"bad meta.json: {exc!r}") from None


def map_all(
    entry: Path, meta: Sequence[TierFile], *, read_only: bool = False
) -> list[torch.Tensor] | None:
    """Mappings of every data file (``map_file``), not yet populated (``populate_files``
    and ``check_files`` populate them on every CPU); None if one has vanished (evicted
    meanwhile).

    Raises ``BadEntry`` when a data file's size differs from its meta.json's.
    """
    buffers: list[torch.Tensor] = []
    for i, f in enumerate(meta):
        path = entry / f"{i}.data"
        if f.data_bytes == 0:
            buffers.append(torch.empty(0, dtype=torch.uint8))
            continue
        try:
            size_bytes = path.stat().st_size
            if size_bytes != f.data_bytes:
                raise BadEntry(f"{f.path} holds {size_bytes} bytes, expected {f.data_bytes}")
            buffers.append(map_file(path, f.data_bytes, read_only=read_only))
        except (OSError, ValueError):  # gone (evicted meanwhile), or shrunk since the stat
            return None
    return buffers


def map_file(path: Path, nbytes: int, *, read_only: bool = False) -> torch.Tensor:
    """A CPU uint8 tensor over a data file's tmpfs pages (no copy), not yet populated
    (``populate_pages``, by pieces on every CPU: ``populate_files``, ``check_files``).

    ``read_only=False`` (tensors handed to the function): ``MAP_PRIVATE``,
    readable and writable; a write copies the page it touches (copy-on-write).
    ``read_only=True`` (the source of a copy to a device): ``MAP_SHARED`` and
    ``PROT_READ``; pinning it (``cudaHostRegister``) pins the tier's own pages,
    where pinning a private writable mapping would make the kernel give the pin
    a private copy of every page. A write to it is ``SIGSEGV``: never hand it out.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        if read_only:
            mapped = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        else:
            prot = mmap.PROT_READ | mmap.PROT_WRITE
            mapped = mmap.mmap(fd, nbytes, flags=mmap.MAP_PRIVATE, prot=prot)
    finally:
        os.close(fd)  # the mapping keeps its own reference to the file
    with warnings.catch_warnings():
        # A read-only buffer: torch warns that it has no read-only tensors; see above.
        warnings.filterwarnings("ignore", "The given buffer is not writable", UserWarning)
        return torch.frombuffer(mapped, dtype=torch.uint8)


def populate_pages(buf: torch.Tensor, name: str) -> None:
    """Map every page of ``buf`` (a mapping of data file ``name``, or a page-aligned
    part of one) now, for reading, in one call (no copy: the page tables point at the
    tmpfs pages); where the kernel cannot (before 5.14) the pages fault in on first
    use. Raises ``BadEntry`` when a page cannot be read (the file shrank).

    Not ``MAP_POPULATE``: on a private writable mapping it populates for writing,
    copying every page.
    """
    try:
        populate_read(buf.data_ptr(), buf.numel())
    except OSError as exc:
        raise BadEntry(f"{name} cannot be read: {exc.strerror}") from None


def populate_files(meta: Sequence[TierFile], buffers: Sequence[torch.Tensor]) -> None:
    """``populate_pages`` for every file's pieces, at once on the usable CPUs (the
    kernel's page-table work for one piece does not wait for another's)."""
    tasks = [(i, begin, end) for i, f in enumerate(meta) for begin, end in f.pieces()]
    run_each(
        tasks,
        lambda t: populate_pages(buffers[t[0]][t[1] : t[2]], meta[t[0]].path),
        "thaw-tier-populate",
    )


def check_files(meta: Sequence[TierFile], buffers: Sequence[torch.Tensor]) -> list[TierFile]:
    """Check every file's bytes against its recorded checksums (a format-1 file: its
    blake3 digest); raise ``BadEntry`` naming the first (in order) that differs.

    Pieces are checked at once, a thread each up to the CPUs this process may use
    (xxh3 and blake3 release the GIL): a hit waits for about its bytes divided by
    the CPUs' rate, even for a model in one file. Each thread maps its piece's pages
    (``populate_pages``) before checking them, so the page-table work is shared
    between the CPUs too. Returns
    the files with every checksum recorded: a format-1 file gains the checksums of
    its bytes, just proved by the digest.
    """
    if len(meta) != len(buffers):
        raise ValueError(f"{len(meta)} files but {len(buffers)} buffers")
    tasks = [(i, begin, end) for i, f in enumerate(meta) for begin, end in _check_units(f)]
    views = [bytes_view(b) for b in buffers]

    def check(task: tuple[int, int, int]) -> None:
        i, begin, end = task
        populate_pages(buffers[i][begin:end], meta[i].path)
        check_piece(meta[i], views[i], begin, end)

    run_each(tasks, check, "thaw-tier-check")
    return [f if f.checksums is not None else _recorded(f, views[i]) for i, f in enumerate(meta)]


def _check_units(f: TierFile) -> list[tuple[int, int]]:
    """What one check covers: a piece, or a format-1 file whole (one digest)."""
    return f.pieces() if f.checksums is not None else [(0, f.data_bytes)]


def check_piece(f: TierFile, view: memoryview, begin: int, end: int) -> None:
    """Check ``view[begin:end]``, one of ``f.pieces()`` (a format-1 file: all of it)."""
    data = view[begin:end]
    if f.checksums is not None:
        expected = f.checksums[begin // max(f.piece_bytes, 1)]
        if checksum_bytes(data) != expected:
            raise BadEntry(f"{f.path} does not match its checksum (bytes {begin}-{end})")
    elif f.old_digest is None or digest_bytes(data) != f.old_digest:
        raise BadEntry(f"{f.path} does not match its digest")


def _recorded(f: TierFile, view: memoryview) -> TierFile:
    """A format-1 file, just checked, with the checksums of its pieces."""
    pieces = TierFile(f.path, f.data_bytes, None).pieces()
    return TierFile(f.path, f.data_bytes, tuple(checksum_bytes(view[b:e]) for b, e in pieces))


def bytes_view(buf: torch.Tensor) -> memoryview:
    return buf.numpy().data.cast("B") if buf.numel() else memoryview(b"")


def write_entry(
    entry: Path,
    manifest_digest: str,
    manifest_json: bytes,
    files: Sequence[FileShape],
    buffers: Sequence[torch.Tensor],
) -> None:
    tmp = entry.parent / f"{TMP_PREFIX}{uuid.uuid4().hex}"
    tmp.mkdir()
    try:
        held = [
            TierFile(f.path, f.data_bytes, write_data(tmp / f"{i}.data", buf))
            for i, (f, buf) in enumerate(zip(files, buffers, strict=True))
        ]
        (tmp / "manifest.json").write_bytes(manifest_json)
        (tmp / "meta.json").write_text(_meta_json(manifest_digest, held))
        tmp.rename(entry)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def rewrite_meta(entry: Path, manifest_digest: str, files: Sequence[TierFile]) -> None:
    """Replace an entry's ``meta.json`` atomically (the current format, every checksum
    recorded)."""
    tmp = entry / f"{TMP_PREFIX}meta-{uuid.uuid4().hex}"
    try:
        tmp.write_text(_meta_json(manifest_digest, files))
        tmp.replace(entry / "meta.json")
    finally:
        tmp.unlink(missing_ok=True)


def _meta_json(manifest_digest: str, files: Sequence[TierFile]) -> str:
    if any(f.checksums is None for f in files):
        raise ValueError(f"every file of a format-{FORMAT} entry records its checksums")
    doc = {
        "format": FORMAT,
        "manifest_digest": manifest_digest,
        "files": [
            {
                "path": f.path,
                "data_bytes": f.data_bytes,
                "piece_bytes": f.piece_bytes,
                "xxh3": [f"{c:016x}" for c in f.checksums or ()],
            }
            for f in files
        ],
    }
    return json.dumps(doc, sort_keys=True)


def write_data(path: Path, buf: torch.Tensor) -> tuple[int, ...]:
    """Copy ``buf`` (any device) into a new tier file; returns the checksums of what it
    holds, one per ``PIECE_BYTES``.

    Plain ``write``s, not a shared mapping: a full tmpfs is then ``ENOSPC``
    (never ``SIGBUS``), and writing skips the page faults of a fresh mapping
    (about 2.5x faster). A device buffer goes through host pieces of
    ``PIECE_BYTES``, so the host never holds a second full copy.
    """
    checksums = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        for begin in range(0, buf.numel(), PIECE_BYTES):
            piece = buf[begin : begin + PIECE_BYTES]
            view = bytes_view(piece if piece.device.type == "cpu" else piece.cpu())
            checksums.append(checksum_bytes(view))  # the bytes written: what a read checks
            _write_all(fd, view)
    finally:
        os.close(fd)
    os.chmod(path, 0o444)
    return tuple(checksums)


def _write_all(fd: int, data: memoryview) -> None:
    while data:
        written = os.write(fd, data)
        data = data[written:]


def touch(path: Path) -> None:
    """Mark an entry used now; best effort (a lost touch only ages the entry)."""
    now_ns = time.time_ns()
    with contextlib.suppress(OSError):
        os.utime(path, ns=(now_ns, now_ns))


def write_json_atomic(path: Path, doc: dict[str, float]) -> None:
    tmp = path.with_name(f"{TMP_PREFIX}{uuid.uuid4().hex}")
    try:
        tmp.write_text(json.dumps(doc))
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
