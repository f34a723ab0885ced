"""A Hugging Face checkpoint pushed in the form its model class holds now.

transformers 5 holds a mixture of experts' matrices stacked, one tensor per layer, and
converts the per-expert form ``save_pretrained`` writes as ``from_pretrained`` loads it
(``snapshotter.hf_names``). A fill that converts makes the stacks as new tensors beside
the buffer the checkpoint was loaded into, and that buffer stays (the layers' other
tensors are views of it): a mixture of experts filled from such a checkpoint holds its
experts twice, on the device or in the replica's memory.

``converted_checkpoint`` writes the checkpoint once, at push, under the model's own
names and layouts, with transformers' own conversion tables: the artifact then fills
with no copy, as any other. The directory's other files come along as they are (linked,
not copied, where the file system allows). A checkpoint already in the model's names,
a directory with no transformers ``config.json`` at its root, or a model class
transformers cannot build are left alone (None): the fill converts what it must.

The conversion reads the stored tensors a layer at a time (memory mapped) and writes
shards of at most ``shard_bytes``; it needs free disk for the converted shards where it
writes them (``TMPDIR`` for a push).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

SHARD_BYTES = 4 << 30
INDEX_NAME = "model.safetensors.index.json"
CONVERTED_ANNOTATION = "thaw.converted"  # the manifest's note: who converted it, from what

ConvertProgress = Callable[[int, int], None]  # (the checkpoint's tensor bytes read, of all)

_LAYER = re.compile(r"\.(\d+)\.")  # the first index in a name: its layer, for grouping


@dataclass(frozen=True)
class Conversion:
    model_class: str
    note: str  # for the manifest's annotations


def converted_checkpoint(
    src: Path,
    dst: Path,
    *,
    shard_bytes: int = SHARD_BYTES,
    progress: ConvertProgress | None = None,
) -> Conversion | None:
    """Write ``src``'s checkpoint into ``dst`` (a new directory) in its model class's
    names, with ``src``'s other files beside it; None, writing nothing, when ``src``
    needs no conversion (see the module docstring)."""
    shards = sorted(p for p in src.glob("*.safetensors") if p.is_file())
    model = _meta_model(src) if shards else None
    if model is None:
        return None
    from safetensors import safe_open

    from snapshotter.hf_names import model_named
    from snapshotter.safetensors_header import read_safetensors_header

    expected = model.state_dict(keep_vars=True)
    stored_in = {p: read_safetensors_header(p).tensors for p in shards}
    where = {t.name: p for p, tensors in stored_in.items() for t in tensors}
    if all(name in expected for name in where):
        return None
    sizes = {t.name: t.nbytes for tensors in stored_in.values() for t in tensors}
    total = sum(sizes.values())
    dst.mkdir(parents=True)
    writer = _ShardWriter(dst, shard_bytes)
    read = 0
    with ExitStack() as files:
        opened = {p: files.enter_context(safe_open(p, "pt")) for p in shards}
        for group in _layer_groups(where):
            stored = {name: opened[where[name]].get_tensor(name) for name in group}
            for name, tensor in model_named(model, stored, expected).items():
                writer.add(name, tensor)
            read += sum(sizes[name] for name in group)
            if progress is not None:
                progress(read, total)
    writer.close()
    _link_others(src, dst, skip={p.name for p in shards} | {INDEX_NAME})
    import transformers

    cls = type(model).__name__
    note = f"{len(where)} tensors of {cls} converted by transformers {transformers.__version__}"
    return Conversion(cls, note)


def _meta_model(src: Path) -> Any | None:
    """``src``'s transformers model class built on the meta device (no memory), or None
    when its ``config.json`` names none that transformers has."""
    config_path = src / "config.json"
    if not config_path.is_file():
        return None
    try:
        architectures = json.loads(config_path.read_text()).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        return None  # the push's own checks report a broken config
    if not architectures:
        return None
    import torch
    import transformers

    cls = getattr(transformers, str(architectures[0]), None)
    if cls is None or not hasattr(cls, "config_class"):
        return None
    try:
        config = transformers.AutoConfig.from_pretrained(src, local_files_only=True)
        with torch.device("meta"):
            return cls(config)
    except Exception as exc:  # the fill meets the same model: it says what is wrong
        log.info("%s: no conversion at push (%s cannot be built: %s)", src, cls.__name__, exc)
        return None


def _layer_groups(where: dict[str, Path]) -> Iterator[list[str]]:
    """The checkpoint's names a layer at a time (a conversion never joins tensors of two
    layers), in the layers' order; names with no layer index last, together."""
    groups: dict[int, list[str]] = {}
    rest: list[str] = []
    for name in where:
        found = _LAYER.search(name)
        (groups.setdefault(int(found.group(1)), []) if found else rest).append(name)
    for layer in sorted(groups):
        yield groups[layer]
    if rest:
        yield rest


class _ShardWriter:
    """Tensors into ``model-XXXXX.safetensors`` shards of at most ``limit`` bytes (a
    tensor larger than that alone), then the index ``from_pretrained`` reads."""

    def __init__(self, dst: Path, limit: int) -> None:
        self.dst, self.limit = dst, limit
        self.pending: dict[str, torch.Tensor] = {}
        self.pending_bytes = 0
        self.written: list[tuple[str, list[str]]] = []  # a shard's file name, its tensors
        self.total_bytes = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        size = tensor.numel() * tensor.element_size()
        if self.pending and self.pending_bytes + size > self.limit:
            self._flush()
        self.pending[name] = tensor.contiguous()
        self.pending_bytes += size
        self.total_bytes += size

    def _flush(self) -> None:
        from safetensors.torch import save_file

        file_name = f"model-{len(self.written) + 1:05d}.safetensors"
        save_file(self.pending, self.dst / file_name, metadata={"format": "pt"})
        self.written.append((file_name, list(self.pending)))
        self.pending, self.pending_bytes = {}, 0

    def close(self) -> None:
        if self.pending:
            self._flush()
        if len(self.written) == 1:  # one shard: named as save_pretrained names it
            os.replace(self.dst / self.written[0][0], self.dst / "model.safetensors")
            return
        n = len(self.written)
        weight_map: dict[str, str] = {}
        for i, (file_name, names) in enumerate(self.written, start=1):
            final = f"model-{i:05d}-of-{n:05d}.safetensors"
            os.replace(self.dst / file_name, self.dst / final)
            weight_map.update(dict.fromkeys(names, final))
        index = {"metadata": {"total_size": self.total_bytes}, "weight_map": weight_map}
        (self.dst / INDEX_NAME).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")


def _link_others(src: Path, dst: Path, skip: set[str]) -> None:
    """``src``'s files and folders other than ``skip`` (its root's names) into ``dst``:
    hard links where the file system allows, copies elsewhere."""
    for entry in sorted(src.iterdir()):
        if entry.name in skip:
            continue
        target = dst / entry.name
        if entry.is_dir() and not entry.is_symlink():
            shutil.copytree(entry, target, copy_function=_link_or_copy, symlinks=True)
        else:
            _link_or_copy(str(entry), str(target))


def _link_or_copy(source: str, target: str) -> str:
    try:
        os.link(source, target, follow_symlinks=False)
    except OSError:
        shutil.copy2(source, target, follow_symlinks=False)
    return target
