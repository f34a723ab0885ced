"""A Hugging Face checkpoint's tensors under the names its model class has now.

transformers 5 changed how some architectures hold their weights and converts older
checkpoints as ``from_pretrained`` loads them: a mixture of experts' per-expert
matrices (``block_sparse_moe.experts.3.w1.weight``, Mixtral; ``mlp.experts.3.gate_proj``,
Qwen2-MoE, OLMoE, DeepSeek) are stacked into one tensor per layer
(``mlp.experts.gate_up_proj``), and some names are renamed (GPT-NeoX's ``embed_out``
is ``lm_head``). ``save_pretrained`` writes the older form back, so nearly every such
checkpoint, on the hub or saved locally, is in it.

``fill_module`` fills a model by name, so such a checkpoint would leave the model's
tensors unfilled. ``model_named`` applies transformers' own conversions for the model
(``get_model_conversion_mapping``, the tables ``from_pretrained`` uses), the way
``from_pretrained`` applies them, and returns the tensors under the model's names.
Tensors already named as the model's come back as they are (no copy); a converted
tensor is new (a stack of experts is a copy of them), made where its sources are.
A checkpoint whose names all are the model's is returned untouched, with no lookup.

``checkpoint_names(model)`` then gives, for each of the model's tensors that came
from other names, the checkpoint's names it came from, so that the first call's
access order (``snapshotter.profile.ModuleAccessRecorder``) is recorded in the
names the artifact's manifest has, and its chunks are prefetched in that order.
"""

from __future__ import annotations

import sys
import weakref
from copy import deepcopy
from typing import Any

import torch

# A filled model -> {its tensor's name: the checkpoint names it came from}, for the
# tensors renamed or converted (``model_named``).
_sources: weakref.WeakKeyDictionary[Any, dict[str, tuple[str, ...]]] = weakref.WeakKeyDictionary()


def is_hf_model(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a transformers model (without importing transformers)."""
    if "transformers" not in sys.modules:
        return False
    from transformers import PreTrainedModel

    return isinstance(module, PreTrainedModel)


def model_named(
    model: Any, tensors: dict[str, torch.Tensor], expected: dict[str, Any]
) -> dict[str, torch.Tensor]:
    """``tensors`` (a checkpoint's, by its names) under ``model``'s state-dict names
    (``expected``), converted as ``from_pretrained`` converts them; a name no conversion
    maps to the model stays as it is (the fill reports it)."""
    if all(name in expected for name in tensors):
        return tensors
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import (
        WeightConverter,
        WeightRenaming,
        dot_natural_key,
        rename_source_key,
    )

    mapping = get_model_conversion_mapping(model)
    renamings = [t for t in mapping if isinstance(t, WeightRenaming)]
    converters = [t for t in mapping if isinstance(t, WeightConverter)]
    by_pattern = {pattern: c for c in converters for pattern in c.source_patterns}
    prefix = model.base_model_prefix
    named: dict[str, torch.Tensor] = {}
    converting: dict[str, Any] = {}  # a target name -> the converter collecting its sources
    sources: dict[str, list[str]] = {}  # a target name -> the checkpoint names it came from
    for name in sorted(tensors, key=dot_natural_key):
        tensor = tensors[name]
        renamed, pattern = rename_source_key(name, renamings, converters, prefix, expected)
        if renamed not in expected and name in expected:
            renamed, pattern = name, None  # named as the model's already
        if renamed not in expected:
            named[name] = tensor  # the model has no such tensor: left for the fill to report
        elif pattern is None:
            named[renamed] = tensor
            if renamed != name:
                sources[renamed] = [name]
        else:
            converter = converting.setdefault(renamed, deepcopy(by_pattern[pattern]))
            converter.add_tensor(renamed, name, pattern, tensor)
            sources.setdefault(renamed, []).append(name)
    came_from: dict[str, tuple[str, ...]] = {k: tuple(v) for k, v in sources.items()}
    for target, converter in converting.items():
        for converted, value in converter.convert(target, model=model, config=model.config).items():
            named[converted] = value[0] if isinstance(value, list) else value
            came_from[converted] = came_from[target]  # a split: each part from them all
    _sources[model] = came_from
    return named


def checkpoint_names(model: Any) -> dict[str, tuple[str, ...]]:
    """For ``model``'s tensors that ``model_named`` renamed or converted, the
    checkpoint's names each came from (empty for a model filled as it was named)."""
    return _sources.get(model, {})
