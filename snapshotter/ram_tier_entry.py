"""One entry of the RAM tier on its tmpfs: written whole, then renamed into place.

See ``snapshotter.ram_tier`` for the layout and the contracts; this module
is the entry's file format (``meta.json`` + one ``<i>.data`` per file) and
the I/O on it, with no policy.

``meta.json`` records each data file's checksum (xxh3, ``snapshotter.digest``)
of the bytes written. Format 1 (older thaw) recorded a blake3 digest of them
instead: such a file's bytes are checked with that digest, and its entry's
``meta.json`` is then written again in format 2.
"""

from __future__ import annotations

import contextlib
import errno
import json
import mmap
import os
import shutil
import time
import uuid
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from snapshotter.digest import Checksummer, checksum_bytes, digest_bytes

FORMAT = 2
_OLD_FORMAT = 1  # blake3 digests instead of checksums
TMP_PREFIX = ".tmp-"
TRASH_PREFIX = ".trash-"
# Device buffers are written through host pieces of this size.
_PIECE_BYTES = 64 << 20
# madvise(2): fault a range's pages in for reading, in one call (Linux 5.14+); Python 3.11's
# mmap module does not name it.
MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)


@dataclass(frozen=True)
class TierFile:
    """One data region held: the loader's buffer for ``path``."""

    path: str
    data_bytes: int
    checksum: int | None  # xxh3 of the data region as written into the tier
    old_digest: str | None = None  # format 1 only (no checksum): blake3 of the same bytes


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
                TierFile(f["path"], int(f["data_bytes"]), None, str(f["digest"]))
                for f in doc["files"]
            ]
        if doc["format"] != FORMAT:
            raise ValueError(f"format {doc['format']}, expected {FORMAT}")
        return [TierFile(f["path"], int(f["data_bytes"]), int(f["xxh3"], 16)) for f in doc["files"]]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BadEntry(f"bad meta.json: {exc!r}") from None


def map_all(
    entry: Path, meta: Sequence[TierFile], *, read_only: bool = False
) -> list[torch.Tensor] | None:
    """Mappings of every data file (``map_file``); None if one has vanished (evicted
    meanwhile).

    Raises ``BadEntry`` when a data file's size differs from its meta.json's, or
    its pages cannot be read.
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
    """A CPU uint8 tensor over a data file's tmpfs pages (no copy), populated in one call.

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
    populate(mapped, path)
    with warnings.catch_warnings():
        # A read-only buffer: torch warns that it has no read-only tensors; see above.
        warnings.filterwarnings("ignore", "The given buffer is not writable", UserWarning)
        return torch.frombuffer(mapped, dtype=torch.uint8)


def populate(mapped: mmap.mmap, path: Path) -> bool:
    """Map every page of ``mapped`` now, for reading (no copy: the page tables point at
    the tmpfs pages); False where the kernel cannot (before 5.14: pages then fault in
    on first use). Raises ``BadEntry`` when a page cannot be read (the file shrank).

    Not ``MAP_POPULATE``: on a private writable mapping it populates for writing,
    copying every page.
    """
    try:
        mapped.madvise(MADV_POPULATE_READ)
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.ENOSYS):
            return False
        raise BadEntry(f"{path.name} cannot be read: {exc}") from None
    return True


def check_files(meta: Sequence[TierFile], buffers: Sequence[torch.Tensor]) -> list[TierFile]:
    """Check every file's bytes against its recorded checksum (a format-1 file: its
    blake3 digest); raise ``BadEntry`` naming the first (in order) that differs.

    Files are checked at once, a thread each up to the CPUs this process may use
    (xxh3 and blake3 release the GIL): a hit waits for its largest file's check,
    not for the sum of them. Returns the files with every checksum recorded: a
    format-1 file gains the checksum of its bytes, just proved by the digest.
    """
    if len(meta) != len(buffers):
        raise ValueError(f"{len(meta)} files but {len(buffers)} buffers")
    workers = min(len(meta), _usable_cpus())
    if workers <= 1:
        return [_check_file(f, buf) for f, buf in zip(meta, buffers, strict=True)]
    with ThreadPoolExecutor(workers, thread_name_prefix="thaw-tier-check") as pool:
        return list(pool.map(_check_file, meta, buffers))  # raises the first in order


def _check_file(f: TierFile, buf: torch.Tensor) -> TierFile:
    view = bytes_view(buf)
    if f.checksum is not None:
        if checksum_bytes(view) != f.checksum:
            raise BadEntry(f"{f.path} does not match its checksum")
        return f
    if f.old_digest is None or digest_bytes(view) != f.old_digest:
        raise BadEntry(f"{f.path} does not match its digest")
    return TierFile(f.path, f.data_bytes, checksum_bytes(view))


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


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
    """Replace an entry's ``meta.json`` atomically (format 2, every checksum recorded)."""
    tmp = entry / f"{TMP_PREFIX}meta-{uuid.uuid4().hex}"
    try:
        tmp.write_text(_meta_json(manifest_digest, files))
        tmp.replace(entry / "meta.json")
    finally:
        tmp.unlink(missing_ok=True)


def _meta_json(manifest_digest: str, files: Sequence[TierFile]) -> str:
    if any(f.checksum is None for f in files):
        raise ValueError("every file of a format-2 entry records its checksum")
    doc = {
        "format": FORMAT,
        "manifest_digest": manifest_digest,
        "files": [
            {"path": f.path, "data_bytes": f.data_bytes, "xxh3": f"{f.checksum:016x}"}
            for f in files
        ],
    }
    return json.dumps(doc, sort_keys=True)


def write_data(path: Path, buf: torch.Tensor) -> int:
    """Copy ``buf`` (any device) into a new tier file; returns the checksum of what it holds.

    Plain ``write``s, not a shared mapping: a full tmpfs is then ``ENOSPC``
    (never ``SIGBUS``), and writing skips the page faults of a fresh mapping
    (about 2.5x faster). A device buffer goes through host pieces of at most
    ``_PIECE_BYTES``, so the host never holds a second full copy.
    """
    hasher = Checksummer()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        for begin in range(0, buf.numel(), _PIECE_BYTES):
            piece = buf[begin : begin + _PIECE_BYTES]
            view = bytes_view(piece if piece.device.type == "cpu" else piece.cpu())
            hasher.update(view)  # the bytes written: what a later read must hash to
            _write_all(fd, view)
    finally:
        os.close(fd)
    os.chmod(path, 0o444)
    return hasher.checksum()


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
