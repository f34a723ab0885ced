"""Fill a module built on the meta device with loaded tensors, without init or copies.

What ``fill_module`` does, in order:

1. ``load_state_dict(tensors, assign=True, strict=False)``: parameters and
   persistent buffers BECOME the loaded tensors (views of the load buffers);
   nothing is initialised, nothing copied.
2. ``module.tie_weights()`` when the module has it (Hugging Face models), so
   a weight the checkpoint omits because it is tied (``lm_head.weight`` with
   ``tie_word_embeddings``) points at its loaded twin.
3. Non-persistent buffers still on meta (never in a checkpoint: rotary
   ``inv_freq`` and the like) are recomputed by building a fresh instance of
   their submodule on the CPU from its ``config`` (``type(sub)(sub.config)``,
   which is how Hugging Face submodules are built) and moving those buffers
   to the device. The submodule is small; no weights are built.
4. Anything still on meta is missing. With ``strict`` a missing or
   unexpected name raises ``StateDictMismatchError`` listing them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from snapshotter.errors import SnapshotterError

if TYPE_CHECKING:
    from snapshotter.loader import LoadedTensors, LoadReport


class StateDictMismatchError(SnapshotterError):
    """The artifact's tensors do not match the module's state dict."""


@dataclass(frozen=True)
class ModuleLoadResult:
    report: LoadReport
    missing_keys: tuple[str, ...]  # still on meta after the fill
    unexpected_keys: tuple[str, ...]  # in the artifact, not in the module
    recomputed_buffers: tuple[str, ...]  # non-persistent buffers rebuilt from config


def fill_module(
    module: torch.nn.Module, tensors: LoadedTensors, device: torch.device, *, strict: bool = True
) -> ModuleLoadResult:
    """Make ``tensors`` the module's state; see the module docstring."""
    expected = set(module.state_dict(keep_vars=True))
    unexpected = tuple(sorted(k for k in tensors if k not in expected))
    module.load_state_dict(
        {k: v for k, v in tensors.items() if k in expected}, strict=False, assign=True
    )
    tie = getattr(module, "tie_weights", None)
    if callable(tie):
        tie()
    recomputed = tuple(_recompute_meta_buffers(module, device))
    missing = tuple(sorted(_still_meta(module)))
    if strict and (missing or unexpected):
        raise StateDictMismatchError(
            f"{tensors.report.ref} does not match {type(module).__name__}: "
            f"missing {list(missing)[:10]} ({len(missing)} in all), "
            f"unexpected {list(unexpected)[:10]} ({len(unexpected)} in all); "
            "check the model class and config, or pass strict=False"
        )
    return ModuleLoadResult(tensors.report, missing, unexpected, recomputed)


def _still_meta(module: torch.nn.Module) -> list[str]:
    names = [n for n, p in module.named_parameters() if p.is_meta]
    names += [n for n, b in module.named_buffers() if b is not None and b.is_meta]
    return names


def _recompute_meta_buffers(module: torch.nn.Module, device: torch.device) -> list[str]:
    done: list[str] = []
    for path, sub in module.named_modules():
        non_persistent: set[str] = getattr(sub, "_non_persistent_buffers_set", set())
        names = [
            n
            for n, b in sub.named_buffers(recurse=False)
            if b is not None and b.is_meta and n in non_persistent
        ]
        if not names:
            continue
        fresh = _rebuild(sub)
        if fresh is None:
            continue
        for name in names:
            value = getattr(fresh, name)
            sub.register_buffer(name, value.to(device), persistent=False)
            done.append(f"{path}.{name}" if path else name)
    return done


def _rebuild(sub: torch.nn.Module) -> torch.nn.Module | None:
    config = getattr(sub, "config", None)
    if config is None:
        return None
    # The caller may still be inside ``with torch.device("meta")``.
    with torch.device("cpu"):
        try:
            return type(sub)(config)
        except TypeError:
            return None
