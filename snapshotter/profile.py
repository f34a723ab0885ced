"""Prefetch profiles: the order a replica first touched tensors, used next time.

A profile is a list of names, stored next to the manifest with
``Registry.put_profile(manifest_digest, order)``. A name is a tensor name
(for safetensors files) or a file path (for any file, e.g. a layer's files).
The loader fetches the chunks covering the profile's names first, in that
order, then every other chunk in file order (the default with no profile).
Names the manifest does not know are ignored, so a stale profile costs only
ordering, never correctness.

Two ways to record one:

- ``record_access(tensors)`` wraps a loaded mapping; every ``[name]`` is
  noted on first access; ``save_profile(registry)`` stores the order.
- ``ModuleAccessRecorder(module)`` hooks a module's submodules; the first
  forward pass notes each submodule's parameters and buffers as it runs.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from snapshotter.manifest import Manifest
from snapshotter.registry import Registry

if TYPE_CHECKING:
    import torch

    from snapshotter.load_types import LoadedTensors


def _name_ranges(manifest: Manifest) -> dict[str, tuple[int, int, int]]:
    """name -> (file index, absolute begin, absolute end) for tensors and files."""
    ranges: dict[str, tuple[int, int, int]] = {}
    for i, f in enumerate(manifest.files):
        ranges.setdefault(f.path, (i, 0, f.size))
        if f.safetensors is None:
            continue
        base = f.safetensors.data_offset
        for t in f.safetensors.tensors:
            ranges.setdefault(t.name, (i, base + t.begin, base + t.end))
    return ranges


def order_chunks(manifest: Manifest, order: Sequence[str] | None) -> list[tuple[int, int]]:
    """Every (file index, chunk index) of the manifest, in prefetch order.

    Chunks covering ``order``'s names come first, in that order; the rest
    follow in file order. Each chunk appears exactly once.
    """
    seen: set[tuple[int, int]] = set()
    out: list[tuple[int, int]] = []
    if order:
        ranges = _name_ranges(manifest)
        starts = [[c.offset for c in f.chunks] for f in manifest.files]
        for name in order:
            span = ranges.get(name)
            if span is None:
                continue
            file_idx, begin, end = span
            first = max(bisect.bisect_right(starts[file_idx], begin) - 1, 0)
            chunks = manifest.files[file_idx].chunks
            for j in range(first, len(chunks)):
                if chunks[j].offset >= end:
                    break
                if chunks[j].end > begin and (file_idx, j) not in seen:
                    seen.add((file_idx, j))
                    out.append((file_idx, j))
    for i, f in enumerate(manifest.files):
        for j in range(len(f.chunks)):
            if (i, j) not in seen:
                out.append((i, j))
    return out


class AccessRecorder(Mapping[str, "torch.Tensor"]):
    """A read-only view of loaded tensors that notes first-access order."""

    def __init__(self, tensors: LoadedTensors) -> None:
        self._tensors = tensors
        self._order: dict[str, None] = {}

    def __getitem__(self, name: str) -> torch.Tensor:
        tensor = self._tensors[name]
        self._order.setdefault(name, None)
        return tensor

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    @property
    def order(self) -> list[str]:
        return list(self._order)

    def save_profile(self, registry: Registry) -> list[str]:
        """Store the order seen so far as the manifest's profile; returns it."""
        order = self.order
        registry.put_profile(self._tensors.manifest_digest, order)
        return order


def record_access(tensors: LoadedTensors) -> AccessRecorder:
    return AccessRecorder(tensors)


class ModuleAccessRecorder:
    """Notes the state-dict names of a module's tensors in first-forward order.

    Use as a context manager around the first forward pass(es); hooks are
    removed on exit. ``prefix`` is prepended to every name (for wrappers whose
    state-dict keys differ from the checkpoint's).
    """

    def __init__(self, module: torch.nn.Module, prefix: str = "") -> None:
        from snapshotter.hf_names import checkpoint_names

        self._module = module
        self._prefix = prefix
        # A tensor converted from others at fill (a stack of experts) is recorded as
        # those, the names the manifest has.
        self._came_from = checkpoint_names(module)
        self._order: dict[str, None] = {}
        self._handles: list[Any] = []

    def __enter__(self) -> ModuleAccessRecorder:
        for path, sub in self._module.named_modules():
            self._handles.append(sub.register_forward_pre_hook(self._hook_for(path)))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _hook_for(self, path: str) -> Any:
        def hook(sub: torch.nn.Module, _args: object) -> None:
            head = f"{path}." if path else ""
            names = [n for n, _ in sub.named_parameters(recurse=False)]
            names += [n for n, _ in sub.named_buffers(recurse=False)]
            for name in names:
                for stored in self._came_from.get(head + name, (head + name,)):
                    self._order.setdefault(self._prefix + stored, None)

        return hook

    @property
    def order(self) -> list[str]:
        return list(self._order)

    def save_profile(self, registry: Registry, manifest_digest: str) -> list[str]:
        order = self.order
        registry.put_profile(manifest_digest, order)
        return order
