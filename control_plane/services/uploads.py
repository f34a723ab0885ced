"""A directory uploaded from a browser, pushed to the store like ``thaw models push``.

The browser sends each file with its path relative to the chosen folder
(``webkitRelativePath``: ``llama/config.json``). ``common_root`` strips the
folder's own name; ``safe_relative`` refuses absolute paths, ``..`` and empty
names before anything is written. Files land in a fresh temporary directory
that is removed whatever happens; the push itself is ``push_directory``, so
an upload dedups, validates and tags exactly as the CLI does.

For a code bundle the ``thaw.toml`` it carries (if any) is parsed and
returned, so the console can fill the deploy form from it.
"""

from __future__ import annotations

import shutil
import tempfile
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

from control_plane.errors import BadRequestError
from snapshotter.errors import BadArtifactError
from snapshotter.manifest import ArtifactKind
from snapshotter.push import PushResult, push_directory
from snapshotter.registry import Registry

KINDS = {"auto": None, "model": ArtifactKind.MODEL, "adapter": ArtifactKind.ADAPTER}
KINDS["bundle"] = ArtifactKind.BUNDLE


@dataclass(frozen=True)
class UploadedFile:
    path: str
    content: BinaryIO


@dataclass(frozen=True)
class UploadResult:
    push: PushResult
    spec: dict[str, Any] | None


def safe_relative(path: str) -> PurePosixPath:
    """``path`` as a relative POSIX path inside the upload; ``BadRequestError`` if it escapes."""
    p = PurePosixPath(path.replace("\\", "/"))
    if not path or p.is_absolute() or any(part in ("", ".", "..") for part in p.parts):
        raise BadRequestError(f"upload path {path!r} is not a plain relative path")
    return p


def common_root(paths: Iterable[PurePosixPath]) -> int:
    """How many leading parts all paths share as a folder (1 for a browser folder pick)."""
    parts = [p.parts for p in paths]
    if not parts or any(len(p) < 2 for p in parts):
        return 0
    return 1 if len({p[0] for p in parts}) == 1 else 0


def _write_all(files: list[UploadedFile], root: Path) -> None:
    rels = [safe_relative(f.path) for f in files]
    strip = common_root(rels)
    for f, rel in zip(files, rels, strict=True):
        target = root.joinpath(*rel.parts[strip:])
        if target.exists():
            raise BadRequestError(f"upload names {rel} twice")
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "wb") as out:
            shutil.copyfileobj(f.content, out, 1 << 20)


def _bundle_spec(root: Path) -> dict[str, Any] | None:
    toml_path = root / "thaw.toml"
    if not toml_path.is_file():
        return None
    try:
        return tomllib.loads(toml_path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise BadRequestError(f"thaw.toml in the upload is not valid TOML: {exc}") from None


def push_upload(
    registry: Registry, ref: str, kind: str, files: list[UploadedFile], chunk_size_bytes: int
) -> UploadResult:
    """Write ``files`` to a temporary directory and push it as ``ref``."""
    if kind not in KINDS:
        raise BadRequestError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
    if not files:
        raise BadRequestError("the upload holds no files; choose a folder with files in it")
    with tempfile.TemporaryDirectory(prefix="thaw-upload-") as tmp:
        root = Path(tmp)
        _write_all(files, root)
        spec = _bundle_spec(root) if kind == "bundle" else None
        try:
            result = push_directory(
                root, ref, registry, kind=KINDS[kind], chunk_size_bytes=chunk_size_bytes
            )
        except BadArtifactError as exc:
            # The temporary path means nothing to the person who chose the folder.
            why = str(exc).replace(f"{root}/", "").replace(str(root), "the folder")
            raise BadRequestError(f"the uploaded folder cannot be pushed: {why}") from None
    return UploadResult(result, spec)
