"""Build a model skeleton to fill: parameters on the meta device, buffers real.

``with empty_weights(): model = SomeModel(config)`` runs the model's own
constructor, but every parameter it registers is replaced by a meta tensor of
the same shape and dtype (no memory, no initialisation), while buffers are
made as the constructor makes them, on the CPU. Non-persistent buffers
(BERT's ``position_ids`` and ``token_type_ids``, rotary ``inv_freq``) are never
in a checkpoint, so this is where their values come from;
``snapshotter.module_fill.fill_module`` then moves them to the device.
This is what accelerate's ``init_empty_weights(include_buffers=False)`` does.

``torch.device("meta")`` instead puts buffers on meta too, and their values
are lost; ``fill_module`` rebuilds them with ``rebuilt_buffer``, which works
for modules that can be built again from their ``config`` (Hugging Face
models), and fails naming the others. A buffer a constructor makes from a
parameter (``zeros_like(self.weight)``) is on meta either way: it must come
from the checkpoint.

The hook is process-wide while the block runs: a module another thread builds
meanwhile gets meta parameters too. Build models in ``setup``, one at a time.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.nn.modules.module import register_module_parameter_registration_hook

__all__ = ["empty_weights", "rebuilt_buffer"]


@contextmanager
def empty_weights() -> Iterator[None]:
    """Parameters registered in the block are meta tensors; buffers stay real, on the CPU."""
    # torch types the hook as returning None; a Parameter it returns replaces the one
    # registered (documented in register_module_parameter_registration_hook).
    handle = register_module_parameter_registration_hook(_parameter_to_meta)  # type: ignore[arg-type]
    try:
        # The caller may be inside ``with torch.device("meta")``: buffers must be real.
        with torch.device("cpu"):
            yield
    finally:
        handle.remove()


def _parameter_to_meta(
    module: torch.nn.Module, name: str, param: torch.nn.Parameter | None
) -> torch.nn.Parameter | None:
    # Subclasses (lazy or quantised parameters) carry state of their own: left as made.
    if param is None or type(param) is not torch.nn.Parameter or param.is_meta:
        return None
    meta = torch.nn.Parameter(param.detach().to("meta"), requires_grad=param.requires_grad)
    meta.__dict__.update(param.__dict__)
    return meta


def rebuilt_buffer(
    root: torch.nn.Module, path: str, like: torch.Tensor, cache: dict[str, torch.nn.Module | None]
) -> torch.Tensor | None:
    """The buffer at ``path`` as a fresh build of a module holding it makes it.

    Tries ``root`` first, then each module on the way down to the buffer's
    own: the first that has a ``config`` is built again as ``type(m)(config)``
    under ``empty_weights`` (no parameter memory). The outermost goes first
    because a submodule may have been built with more than its config (a
    window size, a layer type) by its parent, and a build with the config
    alone would give other values. A build whose buffer is missing, still on
    meta, or not shaped like ``like`` is passed over. ``cache`` keeps each
    module path's build (None: it cannot be built) across calls. None when no
    module on the way gives the buffer.
    """
    parts = path.split(".")
    for depth in range(len(parts)):
        owner = ".".join(parts[:depth])
        if owner not in cache:
            cache[owner] = _build_again(root.get_submodule(owner))
        fresh = cache[owner]
        if fresh is None:
            continue
        try:
            value = fresh.get_buffer(".".join(parts[depth:]))
        except AttributeError:
            continue
        if not value.is_meta and value.shape == like.shape:
            return value
    return None


def _build_again(module: torch.nn.Module) -> torch.nn.Module | None:
    config = getattr(module, "config", None)
    if config is None:
        return None
    try:
        with empty_weights():
            return type(module)(copy.deepcopy(config))
    except Exception:  # any failure means only: not buildable from its config alone
        return None
