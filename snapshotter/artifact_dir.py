"""What a push reads: a directory checked and listed, before anything is written.

``inspect_directory`` walks the directory once and refuses, with a
``BadArtifactError`` naming the offending path:

* a pickle checkpoint anywhere (``.bin .pt .pth .ckpt .pkl .pickle``), judged by
  name only: the file is never opened, because unpickling runs arbitrary code;
* a symlink whose target leaves the directory, a dangling symlink, a symlinked
  directory, or anything that is not a regular file (fifo, socket, device);
* for models and adapters, a directory with no ``*.safetensors`` file;
* any safetensors file whose header fails ``safetensors_header`` validation;
* for models and adapters, a ``*.json`` file that ``json_doc.parse_json``
  refuses (too deep, not UTF-8, not JSON, a key twice, an absurd number), or a
  config (``CONFIG_FILES``) that is not a JSON object;
* a ``*.safetensors.index.json`` that is not such an object with a weight map,
  or whose weight map names a missing shard or a tensor the shard does not hold.

``__pycache__`` folders are skipped. Files are listed by their relative POSIX
path, sorted, and their mode is normalised to 0o755 (owner-executable) or
0o644, as git does, so the manifest does not depend on the pusher's umask.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from snapshotter.errors import BadArtifactError
from snapshotter.json_doc import parse_json, parse_json_object
from snapshotter.manifest import ArtifactKind, SafetensorsInfo
from snapshotter.safetensors_header import read_safetensors_header

PICKLE_SUFFIXES = frozenset({".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle"})
SKIPPED_DIRS = frozenset({"__pycache__"})
ADAPTER_MARKER = "adapter_config.json"
INDEX_SUFFIX = ".safetensors.index.json"
CONFIG_FILES = frozenset(
    {
        "config.json",
        "adapter_config.json",
        "generation_config.json",
        "tokenizer_config.json",
        "tokenizer.json",
        "special_tokens_map.json",
    }
)


@dataclass(frozen=True)
class SourceFile:
    """One file to push: where it is read from and what the manifest records."""

    source: Path
    rel_path: str
    size_bytes: int
    mode: int
    safetensors: SafetensorsInfo | None = None


@dataclass(frozen=True)
class ArtifactDir:
    root: Path
    kind: ArtifactKind
    files: tuple[SourceFile, ...]

    @property
    def size_bytes(self) -> int:
        return sum(f.size_bytes for f in self.files)


def detect_kind(root: Path) -> ArtifactKind:
    """``adapter_config.json`` at the top marks a PEFT adapter; anything else is a model."""
    return ArtifactKind.ADAPTER if (root / ADAPTER_MARKER).is_file() else ArtifactKind.MODEL


def inspect_directory(root: Path, kind: ArtifactKind | None = None) -> ArtifactDir:
    """Validate the directory at ``root`` and list its files. Reads headers only."""
    try:
        return _inspect(root, kind)
    except OSError as exc:
        raise BadArtifactError(
            f"cannot read {exc.filename or root}: {exc.strerror or exc}; check its permissions"
        ) from exc


def _inspect(root: Path, kind: ArtifactKind | None) -> ArtifactDir:
    if not root.is_dir():
        raise BadArtifactError(f"{root} is not a directory; give the model or adapter folder")
    root = root.resolve()
    kind = kind or detect_kind(root)
    # Names are judged before any file is even stat'ed as a target, so a
    # pickle is refused without ever being opened.
    names = _walk(root)
    _refuse_pickles(root, [rel for rel, _ in names])
    listed = [(rel, _regular_target(root, rel, path)) for rel, path in names]
    if not listed:
        raise BadArtifactError(f"{root} contains no files to push")
    if kind in (ArtifactKind.MODEL, ArtifactKind.ADAPTER) and not any(
        rel.endswith(".safetensors") for rel, _ in listed
    ):
        raise BadArtifactError(
            f"{root} holds no *.safetensors file, so thaw cannot load it as kind "
            f"{kind.value!r}; "
            "save the weights with save_pretrained(safe_serialization=True)"
        )
    files = tuple(_source_file(rel, source) for rel, source in listed)
    if kind in (ArtifactKind.MODEL, ArtifactKind.ADAPTER):
        _check_json_files(files)
    _check_indexes(root, files)
    return ArtifactDir(root=root, kind=kind, files=files)


def _walk(root: Path) -> list[tuple[str, Path]]:
    """(relative POSIX path, path) for every non-directory entry, sorted by path."""
    out: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root, onerror=_raise):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED_DIRS)
        for d in dirnames:
            if (here / d).is_symlink():
                raise BadArtifactError(
                    f"{(here / d).relative_to(root)} is a symlinked directory; push does not "
                    "follow directory links: copy the files in (cp -rL)"
                )
        for name in filenames:
            path = here / name
            rel = path.relative_to(root).as_posix()
            out.append((rel, path))
    return sorted(out)


def _raise(exc: OSError) -> None:
    # os.walk skips unreadable folders silently; a push must not.
    raise exc


def _regular_target(root: Path, rel: str, path: Path) -> Path:
    """The regular file to read for ``path``: itself, or a symlink's target inside root."""
    if path.is_symlink():
        try:
            target = path.resolve(strict=True)
        except (OSError, RuntimeError):
            raise BadArtifactError(f"{rel} is a dangling or looping symlink") from None
        if not target.is_relative_to(root):
            raise BadArtifactError(
                f"{rel} is a symlink to {target}, outside {root}; copy the file into the "
                "directory (cp -L) so the artifact is self-contained"
            )
        path = target
    if not stat.S_ISREG(path.stat().st_mode):
        raise BadArtifactError(f"{rel} is not a regular file (fifo, socket or device); remove it")
    return path


def _refuse_pickles(root: Path, rels: list[str]) -> None:
    pickles = [r for r in rels if Path(r).suffix.lower() in PICKLE_SUFFIXES]
    if pickles:
        raise BadArtifactError(
            f"{root} contains pickle checkpoint(s) {', '.join(pickles)}; thaw never loads "
            "pickles (unpickling runs arbitrary code). Convert them to safetensors with "
            "model.save_pretrained(path, safe_serialization=True) or "
            "safetensors.torch.save_file(state_dict, 'model.safetensors'), then remove them"
        )


def _source_file(rel: str, source: Path) -> SourceFile:
    st = source.stat()
    mode = 0o755 if st.st_mode & stat.S_IXUSR else 0o644
    header = read_safetensors_header(source, rel) if rel.endswith(".safetensors") else None
    return SourceFile(source, rel, st.st_size, mode, header)


def _check_json_files(files: tuple[SourceFile, ...]) -> None:
    """Every ``*.json`` of a model or adapter parses (``json_doc``), and the files
    transformers and PEFT read as configs hold objects: refused here, at push, with
    one line naming the file, not when a replica starts."""
    for f in files:
        if not f.rel_path.endswith(".json") or f.rel_path.endswith(INDEX_SUFFIX):
            continue  # an index is read whole by ``_check_indexes``
        data = f.source.read_bytes()
        if Path(f.rel_path).name in CONFIG_FILES:
            parse_json_object(data, f.rel_path)
        else:
            parse_json(data, f.rel_path)


def _check_indexes(root: Path, files: tuple[SourceFile, ...]) -> None:
    """Every shard a ``*.safetensors.index.json`` names is present and holds its tensors."""
    by_path = {f.rel_path: f for f in files}
    for index in (f for f in files if f.rel_path.endswith(INDEX_SUFFIX)):
        weight_map = parse_json_object(index.source.read_bytes(), index.rel_path).get("weight_map")
        if not isinstance(weight_map, dict) or not all(
            isinstance(v, str) for v in weight_map.values()
        ):
            raise BadArtifactError(
                f"{index.rel_path} is not a valid index: expected a JSON object with a "
                "'weight_map' of tensor name to shard file"
            )
        pairs = list(weight_map.items())
        folder = Path(index.rel_path).parent
        names: dict[str, set[str]] = {}
        for tensor, shard in pairs:
            rel = (folder / shard).as_posix()
            entry = by_path.get(rel)
            if entry is None or entry.safetensors is None:
                raise BadArtifactError(
                    f"{index.rel_path} maps {tensor!r} to {shard!r}, which is not a "
                    "safetensors file in the directory; copy the missing shard in"
                )
            held = names.setdefault(rel, {t.name for t in entry.safetensors.tensors})
            if tensor not in held:
                raise BadArtifactError(
                    f"{index.rel_path} maps {tensor!r} to {shard!r}, which has no such tensor"
                )
