"""Fill a module skeleton with loaded tensors, without init or copies.

The skeleton is built with ``snapshotter.skeleton.empty_weights`` (parameters
on meta, buffers real) or under ``torch.device("meta")``. What
``fill_module`` does, in order:

0. A Hugging Face model's checkpoint in an older form (per-expert matrices that
   transformers 5 stacks, renamed tensors) is converted as ``from_pretrained``
   converts it (``snapshotter.hf_names``); tensors named as the model's pass as
   they are.
1. ``load_state_dict(tensors, assign=True, strict=False)``: parameters and
   persistent buffers BECOME the loaded tensors (views of the load buffers);
   nothing is initialised, nothing copied.
2. ``module.tie_weights()`` when the module has it (Hugging Face models), so
   a weight the checkpoint omits because it is tied (``lm_head.weight`` with
   ``tie_word_embeddings``) points at its loaded twin.
3. Buffers the checkpoint did not supply are moved to the device: the real
   ones the constructor made, and those still on meta rebuilt as the
   constructor makes them (``skeleton.rebuilt_buffer``). Non-persistent
   buffers (position ids, rotary ``inv_freq``) are never in a checkpoint, by
   design: this is not a mismatch.
4. Anything still on meta fails the fill, ``strict`` or not, with
   ``UnfilledTensorsError`` naming the tensors: a forward pass through them
   would fail or, worse, answer wrongly.
5. With ``strict``, a state-dict name the artifact lacks (a persistent buffer
   now holding the constructor's value) or a tensor the module does not have
   raises ``StateDictMismatchError``; without it they are reported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from snapshotter.errors import SnapshotterError
from snapshotter.hf_names import is_hf_model, model_named
from snapshotter.skeleton import rebuilt_buffer

if TYPE_CHECKING:
    from snapshotter.load_types import LoadedTensors, LoadReport

_LISTED = 10  # names quoted in a message; the count says how many in all


class StateDictMismatchError(SnapshotterError):
    """The artifact's tensors do not match the module's state dict."""


class UnfilledTensorsError(StateDictMismatchError):
    """Tensors are still on the meta device after the fill: the checkpoint lacks them,
    or they are buffers no config rebuilds. Raised whatever ``strict`` says."""


@dataclass(frozen=True)
class ModuleLoadResult:
    report: LoadReport
    missing_keys: tuple[str, ...]  # state-dict names the artifact lacks (constructor values)
    unexpected_keys: tuple[str, ...]  # in the artifact, not in the module
    recomputed_buffers: tuple[str, ...]  # buffers the artifact lacks: the constructor's values


def fill_module(
    module: torch.nn.Module, tensors: LoadedTensors, device: torch.device, *, strict: bool = True
) -> ModuleLoadResult:
    """Make ``tensors`` the module's state; see the module docstring."""
    expected = module.state_dict(keep_vars=True)
    named: dict[str, torch.Tensor] = tensors
    if is_hf_model(module):
        named = model_named(module, tensors, expected)
    unexpected = tuple(sorted(k for k in named if k not in expected))
    module.load_state_dict(
        {k: v for k, v in named.items() if k in expected}, strict=False, assign=True
    )
    tie = getattr(module, "tie_weights", None)
    if callable(tie):
        tie()
    missing = _missing(module, named)
    recomputed = tuple(_place_buffers(module, set(named), device))
    ref = tensors.report.ref if tensors.report is not None else "the weights"
    _refuse_meta(module, expected, ref)
    if strict and (missing or unexpected):
        raise StateDictMismatchError(
            f"{ref} does not match {type(module).__name__}: "
            f"missing {_names(missing)}, unexpected {_names(unexpected)}; "
            "check the model class and config against the checkpoint. If that is "
            "intended (extra tensors in the checkpoint, persistent buffers the "
            "constructor makes), pass strict=False"
        )
    return ModuleLoadResult(tensors.report, missing, unexpected, recomputed)


def _names(names: tuple[str, ...] | list[str]) -> str:
    return f"{list(names)[:_LISTED]} ({len(names)} in all)"


def _missing(module: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> tuple[str, ...]:
    """State-dict names the artifact lacks, less those ``tie_weights`` pointed at a loaded one."""
    state = module.state_dict(keep_vars=True)
    filled = {id(t) for k, t in state.items() if k in tensors}
    return tuple(sorted(k for k, t in state.items() if k not in tensors and id(t) not in filled))


def _place_buffers(module: torch.nn.Module, loaded: set[str], device: torch.device) -> list[str]:
    """Buffers not in ``loaded`` onto ``device``, those on meta rebuilt first; their names."""
    done: list[str] = []
    builds: dict[str, torch.nn.Module | None] = {}
    for path, value in list(module.named_buffers(remove_duplicate=False)):
        if path in loaded or value is None:
            continue
        if value.is_meta:
            fresh = rebuilt_buffer(module, path, value, builds)
            if fresh is None:
                continue  # left on meta: _refuse_meta names it
            value = fresh.to(dtype=value.dtype)
        elif value.device == device:
            done.append(path)
            continue
        owner, _, name = path.rpartition(".")
        sub = module.get_submodule(owner)
        persistent = name not in sub._non_persistent_buffers_set
        sub.register_buffer(name, value.to(device), persistent=persistent)
        done.append(path)
    return done


def _refuse_meta(module: torch.nn.Module, expected: dict[str, torch.Tensor], ref: str) -> None:
    """Raise ``UnfilledTensorsError`` naming every tensor still on meta, and why."""
    params = [n for n, p in module.named_parameters(remove_duplicate=False) if p.is_meta]
    buffers = [
        n for n, b in module.named_buffers(remove_duplicate=False) if b is not None and b.is_meta
    ]
    if not params and not buffers:
        return
    lacking = [n for n in [*params, *buffers] if n in expected]
    unbuilt = [n for n in buffers if n not in expected]
    advice = []
    if lacking:
        advice.append(
            f"{_names(lacking)} are not in {ref}: the model class or config does not "
            "match the checkpoint"
        )
    if unbuilt:
        advice.append(
            f"non-persistent buffers {_names(unbuilt)} could not be rebuilt from a config: "
            "build the model under snapshotter.skeleton.empty_weights() (ctx.empty_weights() "
            "in a function), which keeps buffers real"
        )
    raise UnfilledTensorsError(
        f"{len(params) + len(buffers)} tensors of {type(module).__name__} are still on the "
        f"meta device after filling it from {ref}: " + "; ".join(advice)
    )
