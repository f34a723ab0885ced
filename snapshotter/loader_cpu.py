"""The CPU placer: chunks are decoded straight into the file buffers."""

from __future__ import annotations

import torch

from snapshotter.load_plan import ChunkWork
from snapshotter.pipeline import Target


class CpuPlacer:
    """Chunks decode straight into the file buffers; duplicates are memcpy'd.

    ``map_pages``: the buffers are private anonymous mappings this load owns
    (``snapshotter.pages.anonymous_buffer``, or carved from a
    ``snapshotter.host_arena.HostArena``), so a cache hit may map its entry's pages
    into them instead of copying.
    """

    def __init__(self, buffers: list[torch.Tensor], *, map_pages: bool = False) -> None:
        self._views = [b.numpy().data for b in buffers]
        self._map_pages = map_pages

    def target(self, work: ChunkWork) -> Target:
        direct = work.direct
        if direct is None:
            return Target(memoryview(bytearray(work.chunk.size)))
        begin = direct.dest_begin
        view = self._views[direct.file_idx][begin : begin + work.chunk.size]
        return Target(view, direct, map_pages=self._map_pages)

    def commit(self, work: ChunkWork, target: Target) -> None:
        for p in work.placements:
            if p is target.handle:
                continue
            dest = self._views[p.file_idx]
            dest[p.dest_begin : p.dest_begin + p.nbytes] = target.view[p.src_begin : p.src_end]

    def abandon(self, work: ChunkWork, target: Target) -> None:
        return None
