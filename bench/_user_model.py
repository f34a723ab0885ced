"""A user's model (and adapters) for ``thaw bench coldstart|load --model DIR``: checked
before anything runs.

Every check reads only names, ``config.json``/``adapter_config.json`` and safetensors
headers (``snapshotter.artifact_dir``); no weight is read and nothing is unpickled.
Each raises ``BadInput`` with a message that says what is wrong and what to do:

* not a model directory: not a directory, no ``config.json``, no ``*.safetensors``;
* a pickle checkpoint (``pytorch_model.bin`` …): refused with the conversion hint;
* an adapter whose base does not match the model: a ``target_modules`` entry no
  module of the model ends with, or a LoRA pair whose shapes do not fit the weight it
  adapts (``lora_A`` is ``(r, in)``, ``lora_B`` ``(out, r)``; a Conv1D weight, as in
  GPT-2, is stored ``(in, out)``, so either orientation is accepted);
* too little disk or RAM for the run (``room_problem``), said before it starts.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from bench._model import ModelInfo
from snapshotter.artifact_dir import ArtifactDir, inspect_directory
from snapshotter.errors import BadArtifactError
from snapshotter.manifest import ArtifactKind, TensorInfo

ADAPTER_PREFIX = "base_model.model."
LORA_SUFFIXES = (".lora_A.weight", ".lora_B.weight")
GIB = 1 << 30


class BadInput(ValueError):
    """A ``--model``/``--adapter`` the bench cannot run on; the message says why."""


@dataclass(frozen=True)
class Checked:
    """A model directory that passed the checks: its tensors by name (headers only)."""

    root: Path
    tensors: dict[str, TensorInfo]
    weight_bytes: int  # every *.safetensors file's size

    @property
    def shards(self) -> list[Path]:
        return sorted(self.root.glob("*.safetensors"))


def check_model(path: Path) -> Checked:
    """``path`` as a model directory, or ``BadInput`` saying why it is not one."""
    from bench.llm import check_model_dir

    if (why := check_model_dir(path)) is not None:
        raise BadInput(f"--model: {why}")
    listed = _inspect(path, ArtifactKind.MODEL, "--model")
    tensors: dict[str, TensorInfo] = {}
    for f in listed.files:
        if f.safetensors is not None:
            tensors.update({t.name: t for t in f.safetensors.tensors})
    weight_bytes = sum(f.size_bytes for f in listed.files if f.rel_path.endswith(".safetensors"))
    return Checked(path.resolve(), tensors, weight_bytes)


def _inspect(path: Path, kind: ArtifactKind, option: str) -> ArtifactDir:
    try:
        return inspect_directory(path, kind)
    except BadArtifactError as exc:
        raise BadInput(f"{option}: {exc}") from exc


def check_adapter(path: Path, model: Checked) -> None:
    """``BadInput`` unless ``path`` is a PEFT LoRA adapter that fits ``model``."""
    if not (path / "adapter_config.json").is_file():
        raise BadInput(f"--adapter: {path} has no adapter_config.json: give a PEFT adapter folder")
    listed = _inspect(path, ArtifactKind.ADAPTER, "--adapter")
    config = json.loads((path / "adapter_config.json").read_text())
    base = config.get("base_model_name_or_path") or "an unnamed base"
    where = f"--adapter {path} (trained on {base}) does not fit --model {model.root}"
    modules = config.get("target_modules") or []
    if isinstance(modules, str):
        modules = [modules]
    stems = {name.removesuffix(".weight") for name in model.tensors}
    missing = [m for m in sorted(modules) if not any(s == m or s.endswith(f".{m}") for s in stems)]
    if missing:
        names = " or ".join(repr(m) for m in missing)
        raise BadInput(f"{where}: the model has no module named {names}")
    pairs: dict[str, dict[str, tuple[int, ...]]] = {}
    for f in listed.files:
        for t in f.safetensors.tensors if f.safetensors else ():
            for suffix in LORA_SUFFIXES:
                if t.name.endswith(suffix):
                    stem = t.name.removeprefix(ADAPTER_PREFIX).removesuffix(suffix)
                    pairs.setdefault(stem, {})[suffix] = t.shape
    for stem, shapes in sorted(pairs.items()):
        _check_pair(where, stem, shapes, model)


def _check_pair(where: str, stem: str, shapes: dict[str, tuple[int, ...]], model: Checked) -> None:
    weight = model.tensors.get(f"{stem}.weight") or next(
        (t for n, t in model.tensors.items() if n.endswith(f".{stem}.weight")), None
    )
    if weight is None:
        raise BadInput(f"{where}: the model has no weight {stem}.weight")
    a, b = shapes.get(LORA_SUFFIXES[0]), shapes.get(LORA_SUFFIXES[1])
    if a is None or b is None or len(a) != 2 or len(b) != 2:
        raise BadInput(f"{where}: {stem} lacks its lora_A/lora_B pair")
    in_dim, out_dim = a[1], b[0]
    if tuple(weight.shape) not in ((out_dim, in_dim), (in_dim, out_dim)):
        raise BadInput(
            f"{where}: {stem} is {tuple(weight.shape)} in the model but the adapter's LoRA "
            f"maps {in_dim} -> {out_dim}; use an adapter trained on this model"
        )


@dataclass(frozen=True)
class Room:
    """Bytes a run needs and has: disk under its scratch directory, RAM available."""

    disk_need: int
    disk_free: int
    ram_need: int
    ram_free: int


def room_problem(room: Room) -> str | None:
    """What is short, or None. Pure."""
    short = []
    if room.disk_need > room.disk_free:
        short.append(f"disk: needs {_gib(room.disk_need)}, {_gib(room.disk_free)} free")
    if room.ram_need > room.ram_free:
        short.append(f"RAM: needs {_gib(room.ram_need)}, {_gib(room.ram_free)} available")
    if not short:
        return None
    return f"too little room for this run ({'; '.join(short)}): free some or use a smaller model"


def _gib(n_bytes: int) -> str:
    return f"{n_bytes / GIB:.1f} GiB"


def available_ram_bytes() -> int:
    """``MemAvailable`` from /proc/meminfo (the whole of RAM where that is unreadable)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_room(scratch: Path, disk_need: int, ram_need: int) -> None:
    """``BadInput`` when the disk under ``scratch`` or the RAM cannot hold the run."""
    probe = scratch
    while not probe.exists():
        probe = probe.parent
    room = Room(disk_need, shutil.disk_usage(probe).free, ram_need, available_ram_bytes())
    if (why := room_problem(room)) is not None:
        raise BadInput(why)


def model_info(model: Checked) -> ModelInfo:
    """The loader bench's description of a checked model; reads every tensor once for the
    checksum each trial's result is compared with."""
    from bench._model import checksum_files

    shards = model.shards
    checksum, n_tensors = checksum_files(shards)
    return ModelInfo(
        directory=str(model.root),
        files=[str(p) for p in shards],
        total_tensor_bytes=sum(t.nbytes for t in model.tensors.values()),
        total_file_bytes=model.weight_bytes,
        n_tensors=n_tensors,
        checksum=checksum,
    )
