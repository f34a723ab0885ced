"""thaw's snapshotter: artifacts as manifests + content-addressed chunks.

Load side (imported lazily, so ``import snapshotter`` does not import torch)::

    from snapshotter import Snapshotter, DiskCache
    snap = Snapshotter(registry, DiskCache(cache_config), loader_config)
    tensors = snap.load("llama-tiny:v1", "cuda")      # dict name -> tensor, .report
    snap.load_into_module(meta_model, "llama-tiny:v1", "cuda")

    # With the worker's host-RAM tier, a re-warm maps its weights from shared memory:
    snap = Snapshotter(registry, cache, loader_config, ram_tier=RamTier(ram_tier_config))
    snap = Snapshotter.from_settings()   # store, cache and RAM tier from THAW_* settings
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from snapshotter.cache import CacheInventory, DiskCache
    from snapshotter.loader import (
        LoadedTensors,
        LoadReport,
        Snapshotter,
        load,
        load_into_module,
    )
    from snapshotter.module_fill import ModuleLoadResult
    from snapshotter.profile import ModuleAccessRecorder, record_access
    from snapshotter.ram_tier import RamTier, RamTierInventory
    from snapshotter.source import ChunkSource

_LAZY = {
    "CacheInventory": "snapshotter.cache",
    "DiskCache": "snapshotter.cache",
    "ChunkSource": "snapshotter.source",
    "LoadReport": "snapshotter.loader",
    "LoadedTensors": "snapshotter.loader",
    "Snapshotter": "snapshotter.loader",
    "load": "snapshotter.loader",
    "load_into_module": "snapshotter.loader",
    "ModuleLoadResult": "snapshotter.module_fill",
    "RamTier": "snapshotter.ram_tier",
    "RamTierInventory": "snapshotter.ram_tier",
    "ModuleAccessRecorder": "snapshotter.profile",
    "record_access": "snapshotter.profile",
}

__all__ = [
    "CacheInventory",
    "ChunkSource",
    "DiskCache",
    "LoadReport",
    "LoadedTensors",
    "ModuleAccessRecorder",
    "ModuleLoadResult",
    "RamTier",
    "RamTierInventory",
    "Snapshotter",
    "load",
    "load_into_module",
    "record_access",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'snapshotter' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


# Push side: ``push_directory(dir, "name:tag", Registry(open_store(config)))``,
# ``pull(ref, dest_dir, registry)`` and ``verify(ref, registry)``.
if TYPE_CHECKING:
    from snapshotter.pull import VerifyReport, pull, verify
    from snapshotter.push import PushResult, push_directory
    from snapshotter.registry import Registry
    from snapshotter.stores import open_store

_LAZY.update(
    {
        "PushResult": "snapshotter.push",
        "push_directory": "snapshotter.push",
        "VerifyReport": "snapshotter.pull",
        "pull": "snapshotter.pull",
        "verify": "snapshotter.pull",
        "Registry": "snapshotter.registry",
        "open_store": "snapshotter.stores",
    }
)
__all__ += [
    "PushResult",
    "Registry",
    "VerifyReport",
    "open_store",
    "pull",
    "push_directory",
    "verify",
]
