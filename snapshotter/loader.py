"""Load an artifact's tensors: ``Snapshotter(registry, cache, config).load(ref, device)``.

The result is what ``safetensors.torch.load_file`` gives (name -> tensor,
every tensor of every shard) plus a ``.report``. Each safetensors file is
placed into ONE buffer per load (``torch.empty(data_bytes, uint8)`` on the
target device) and its tensors are views of it (a copy only for a tensor
misaligned for its dtype). The buffers belong to the returned tensors; the
loader keeps no reference.

On the CPU every chunk is decoded straight into its place in the buffer (a
raw cache hit is ``readinto`` the buffer, or, with ``LoaderConfig.map_cache``,
the entry's whole pages mapped into it copy-on-write: the buffer is then its
own anonymous mapping, and the tensors hold page-cache pages of the cache's
files until they are written or freed); on CUDA it goes through pinned
staging buffers and async copies (``snapshotter.loader_cuda``). Every chunk
is checked before it is used: from the store, against its digest; from the
node's disk cache, against the checksum the cache recorded when it wrote the
chunk (see ``snapshotter.source``).

With a host-RAM tier (``snapshotter.ram_tier``), a manifest the tier holds is
mapped from shared memory instead, reading no chunk; a fresh load is kept in
the tier for the next start (``snapshotter.loader_ram``).

On failure no tensor is returned: ``IntegrityError`` names the artifact and
the chunk.

The load side is layered; each module imports only those below it::

    loader        composes them: resolve, plan, RAM tier or pipeline, a placer per device
    loader_pinned                           the RAM tier pinned ahead of a load to CUDA
    loader_cpu  loader_ram  loader_cuda     placers per target (RAM tier: map or keep)
    pipeline      fetch -> check -> place over a ChunkSource (snapshotter.source)
    load_plan     which chunk goes where, in which order (snapshotter.profile)
    load_types    LoadedTensors, LoadReport: what module_fill and profile also use

``module_fill`` sits beside the loader and imports only ``load_types``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from snapshotter.cache import DiskCache
from snapshotter.config import LoaderConfig
from snapshotter.errors import IntegrityError, StoreError
from snapshotter.host_arena import HostArena, arena_bytes
from snapshotter.leases import LeaseKeeper
from snapshotter.load_plan import LoadPlan, plan_load, tensor_view
from snapshotter.load_types import LoadedTensors, LoadReport, PieceCheck, Pieces, StageReport
from snapshotter.loader_cpu import CpuPlacer
from snapshotter.loader_ram import ToDevice, keep, place_held
from snapshotter.manifest import Manifest
from snapshotter.pages import anonymous_buffer
from snapshotter.pipeline import StageTotals, run_pipeline
from snapshotter.ram_tier import RamTier
from snapshotter.registry import Reference, Registry
from snapshotter.source import ChunkSource

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from control_plane.settings import Settings
    from snapshotter.loader_cuda import StagingPool
    from snapshotter.loader_pinned import PinnedTier
    from snapshotter.module_fill import ModuleLoadResult


# Manifests kept parsed, with their plans from the RAM tier, per process: the tier's
# most recent entries are parsed at ``prewarm``, so a pool process's first load reads
# and parses none (1-5 ms for a model of a few hundred tensors).
PARSED_KEPT = 16


class Snapshotter:
    """The load side for one process: a chunk source, its config, staging pools, and
    optionally the worker's host-RAM tier."""

    def __init__(
        self,
        registry: Registry,
        cache: DiskCache | None = None,
        config: LoaderConfig | None = None,
        *,
        source: ChunkSource | None = None,
        ram_tier: RamTier | None = None,
    ) -> None:
        self.registry = registry
        self.config = config or LoaderConfig()
        self.source = source or ChunkSource(registry, cache)
        self.ram_tier = ram_tier
        self._staging: dict[str, StagingPool] = {}
        self._arena: HostArena | None = None
        self._pinned: PinnedTier | None = None
        self._parsed = _Parsed(PARSED_KEPT)

    @classmethod
    def from_settings(cls, settings: Settings | None = None) -> Snapshotter:
        """Store, disk cache, loader config and RAM tier from ``settings`` (default:
        ``Settings()``, i.e. the THAW_* environment); a RAM tier capped at 0 is off."""
        from control_plane.settings import Settings
        from snapshotter.stores import open_store

        s = settings if settings is not None else Settings()
        tier_config = s.ram_tier_config()
        return cls(
            Registry(open_store(s.store_config())),
            DiskCache(s.cache_config()),
            s.loader_config(),
            ram_tier=RamTier(tier_config) if tier_config.max_bytes > 0 else None,
        )

    def resolve(self, ref: str | Reference) -> tuple[str, Manifest]:
        """(manifest digest, manifest). A digest ref with a cached manifest needs no store
        request; NAME:TAG always reads the tag (tags move). A manifest this process
        parsed already is not read again: a digest names one content."""
        digest = self.registry.resolve(ref)
        return digest, self._manifest(digest)

    def _manifest(self, digest: str) -> Manifest:
        kept = self._parsed.get(digest)
        if kept is not None:
            return kept[0]
        manifest = self._read_manifest(digest)
        self._parsed.put(digest, manifest)
        return manifest

    def _read_manifest(self, digest: str) -> Manifest:
        data = self.ram_tier.get_manifest(digest) if self.ram_tier is not None else None
        if data is not None:
            return Manifest.from_json(data)
        cache = self.source.cache
        data = cache.get_manifest(digest) if cache is not None else None
        if data is not None:
            return Manifest.from_json(data)
        manifest = self.registry.get_manifest(digest)
        if cache is not None:
            # A full cache disk only costs the next load one manifest read.
            with contextlib.suppress(StoreError):
                cache.put_manifest(digest, manifest.to_json())
        return manifest

    def _held_plan(self, digest: str, manifest: Manifest) -> LoadPlan:
        """The plan of a load from the RAM tier (no profile: the order of a mapping does
        not matter), made once per manifest."""
        kept = self._parsed.get(digest)
        if kept is not None and kept[1] is not None:
            return kept[1]
        plan = plan_load(manifest)
        self._parsed.put(digest, manifest, plan)
        return plan

    def _plan_tier_entries(self) -> None:
        """Parse and plan the RAM tier's most recent entries ahead of a load."""
        if self.ram_tier is None:
            return
        try:
            recent = self.ram_tier.recent()[:PARSED_KEPT]
        except OSError as exc:  # an optimization: the loads read what they need
            log.info("could not list the RAM tier's entries to plan them ahead: %s", exc)
            return
        for digest in recent:
            try:
                self._held_plan(digest, self._manifest(digest))
            except Exception as exc:  # the load reads it again, and says what is wrong
                log.info("could not plan RAM tier entry %s ahead: %s", digest, exc)

    def _plan(self, digest: str, manifest: Manifest, use_profile: bool) -> LoadPlan:
        # The recorded order only matters when chunks come from the store; a fully
        # cached load skips the profile read, so it makes no store request at all.
        plan = plan_load(manifest)
        cache = self.source.cache
        if not use_profile or (
            cache is not None and all(w.chunk.digest in cache for w in plan.work)
        ):
            return plan
        order = self.registry.get_profile(digest)
        return plan_load(manifest, order) if order else plan

    def read_file(self, ref: str | Reference, path: str) -> bytes:
        """One file of the artifact (e.g. ``config.json``), verified and through the cache.

        Raises ``KeyError`` naming the path when the artifact has no such file.
        """
        _digest, manifest = self.resolve(ref)
        try:
            entry = manifest.file(path)
        except KeyError:
            raise KeyError(f"{ref} has no file {path!r}") from None
        out = bytearray(entry.size)
        view = memoryview(out)
        try:
            for chunk in entry.chunks:
                self.source.load_into(chunk, view[chunk.offset : chunk.end])
        except IntegrityError as exc:
            raise type(exc)(f"{ref}: {exc}") from exc
        return bytes(out)

    def prewarm(self, device: str | torch.device, host_bytes: int = 0) -> None:
        """Ahead of a load: for a CUDA device, allocate the pinned staging pool and
        (with a RAM tier that pins ahead) pin the tier's entries and keep them pinned
        (``snapshotter.loader_pinned``); for the CPU, populate ``host_bytes`` of memory
        that the next loads' buffers are carved from (``snapshotter.host_arena``), so
        they pay no page faults."""
        dev = _check_device(torch.device(device))
        if dev.type == "cuda":
            self._staging_pool(dev)
            tier = self.ram_tier
            if tier is not None and tier.config.pin_ahead and self._pinned is None:
                from snapshotter.loader_pinned import PinnedTier

                self._pinned = PinnedTier(tier, dev)
                self._pinned.start()
        elif host_bytes > 0 and self._arena is None:
            self._arena = HostArena(host_bytes)
        self._plan_tier_entries()

    def pinned_bytes(self, wait_s: float = 0.0) -> dict[str, int]:
        """The RAM tier's entries pinned ahead in this process: manifest digest -> bytes;
        ``wait_s``: first wait up to that long for the entries held at ``prewarm`` to be
        pinned (as a pool process that waited that long would have them)."""
        if self._pinned is None:
            return {}
        self._pinned.wait_ready(wait_s)
        return self._pinned.held()

    def give_back_host_memory(self) -> int:
        """Hand the prewarmed host memory no load used back to the kernel (once the
        loads of a start are done), and release the RAM tier's pinned entries; the
        bytes given back (the pinned pages stay the tier's)."""
        pinned, self._pinned = self._pinned, None
        if pinned is not None:
            pinned.close()
        arena, self._arena = self._arena, None
        return arena.give_back_rest() if arena is not None else 0

    def load(
        self, ref: str | Reference, device: str | torch.device = "cpu", *, use_profile: bool = True
    ) -> LoadedTensors:
        """Every tensor of the artifact on ``device``; see the module docstring."""
        start = time.perf_counter()
        dev = _check_device(torch.device(device))
        digest, manifest = self.resolve(ref)
        held = self._load_held(str(ref), digest, manifest, dev, start)
        if held is not None:
            return held
        plan = self._plan(digest, manifest, use_profile)
        with self._lease(str(ref), digest, plan):
            buffers, prefaulted = self._buffers(plan, dev)
            setup_s = time.perf_counter() - start
            try:
                totals = self._run(plan, buffers, dev)
            except IntegrityError as exc:
                raise type(exc)(f"{ref}: {exc}") from exc
        insert_s = 0.0
        if self.ram_tier is not None:
            buffers, insert_s = keep(self.ram_tier, digest, manifest.to_json(), plan, buffers)
        tensors = _views(plan, buffers)
        tensors.manifest_digest = digest
        tensors.report = _report(str(ref), digest, dev, plan, totals, setup_s, start)
        tensors.report = replace(
            tensors.report,
            ram_tier_insert_s=insert_s,
            prefaulted_bytes=prefaulted,
            arena_bytes=arena_bytes([f.data_bytes for f in plan.files]),
        )
        return tensors

    @contextlib.contextmanager
    def _lease(self, ref: str, digest: str, plan: LoadPlan) -> Iterator[None]:
        """A lease on the manifest while chunks are read from the store; none when leases
        are off, when every chunk is cached (a cached start makes no store request), or
        when the store refuses writes (read-only: GC's grace period is the only guard)."""
        cache = self.source.cache
        cached = cache is not None and all(w.chunk.digest in cache for w in plan.work)
        if self.config.lease_ttl_s <= 0 or cached:
            yield
            return
        keeper = LeaseKeeper(
            self.registry.store, f"load {ref}", ttl_s=self.config.lease_ttl_s, manifests=[digest]
        )
        try:
            keeper.__enter__()
        except StoreError as exc:
            log.warning("loading %s without a gc lease: %s", ref, exc)
            yield
            return
        try:
            yield
        finally:
            keeper.__exit__(None, None, None)

    def _load_held(
        self, ref: str, digest: str, manifest: Manifest, dev: torch.device, start: float
    ) -> LoadedTensors | None:
        """The load from the RAM tier, or None when the tier does not hold the manifest."""
        if self.ram_tier is None:
            return None
        plan = self._held_plan(digest, manifest)
        setup_s = time.perf_counter() - start
        held, pinned = None, 0
        if self._pinned is not None and dev.type == "cuda":
            from snapshotter.loader_pinned import place_pinned

            self._pinned.stop_refreshing()  # this process is becoming a replica
            held = place_pinned(self._pinned, digest, plan, dev)
            pinned = held.total_bytes if held is not None else 0
        if held is None:
            held = place_held(self.ram_tier, digest, plan, dev, self._to_device(dev))
        if held is None:
            return None
        tensors = _views(plan, held.buffers)
        tensors.manifest_digest = digest
        report = _report(ref, digest, dev, plan, held.totals, setup_s, start)
        tensors.report = replace(
            report, ram_tier_bytes=held.total_bytes, ram_tier_pinned_bytes=pinned
        )
        return tensors

    def load_into_module(
        self,
        module: torch.nn.Module,
        ref: str | Reference,
        device: str | torch.device = "cpu",
        *,
        strict: bool = True,
    ) -> ModuleLoadResult:
        """Fill a module built on the meta device; see ``snapshotter.module_fill``."""
        from snapshotter.module_fill import fill_module

        tensors = self.load(ref, device)
        return fill_module(module, tensors, torch.device(device), strict=strict)

    def _buffers(self, plan: LoadPlan, dev: torch.device) -> tuple[list[torch.Tensor], int]:
        """A buffer per file, from the prewarmed host memory where it fits, else new (on
        the CPU, with ``map_cache``, a mapping of its own that cache pages can be mapped
        into); and the bytes that came from the prewarmed memory."""
        arena = self._arena if dev.type == "cpu" else None
        buffers, carved_bytes = [], 0
        for f in plan.files:
            buffer = arena.take(f.data_bytes) if arena is not None else None
            if buffer is None and self._maps_cache(dev):
                buffer = anonymous_buffer(f.data_bytes)
            elif buffer is None:
                buffer = torch.empty(f.data_bytes, dtype=torch.uint8, device=dev)
            else:
                carved_bytes += f.data_bytes
            buffers.append(buffer)
        return buffers, carved_bytes

    def _maps_cache(self, dev: torch.device) -> bool:
        return dev.type == "cpu" and self.config.map_cache and self.source.cache is not None

    def _run(self, plan: LoadPlan, buffers: list[torch.Tensor], dev: torch.device) -> StageTotals:
        if dev.type == "cpu":
            cpu = CpuPlacer(buffers, map_pages=self._maps_cache(dev))
            return run_pipeline(plan.work, self.source, cpu, self.config)
        from snapshotter.loader_cuda import CudaPlacer

        placer = CudaPlacer(buffers, self._staging_pool(dev))
        try:
            totals = run_pipeline(plan.work, self.source, placer, self.config)
        finally:
            sync_s = placer.finish()
        totals.place_s += sync_s
        return totals

    def _to_device(self, dev: torch.device) -> ToDevice:
        """Host buffers to ``dev`` through this process's staging pool (CUDA only)."""

        def to_device(
            host: Sequence[torch.Tensor],
            pieces: Pieces,
            check: PieceCheck | None,
        ) -> tuple[list[torch.Tensor], float]:
            from snapshotter.loader_cuda import copy_to_device

            return copy_to_device(host, dev, self._staging_pool(dev), pieces, check)

        return to_device

    def _staging_pool(self, dev: torch.device) -> StagingPool:
        from snapshotter.loader_cuda import StagingPool, staging_shape

        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        key = str(dev)
        if key not in self._staging:
            slot_bytes, slots = staging_shape(self.config)
            self._staging[key] = StagingPool(slot_bytes, slots)
        return self._staging[key]


def _check_device(dev: torch.device) -> torch.device:
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"cannot load to device {dev}; use 'cpu' or 'cuda[:N]'")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"cannot load to {dev}: this process sees no CUDA device; load to 'cpu'")
    return dev


def _views(plan: LoadPlan, buffers: list[torch.Tensor]) -> LoadedTensors:
    out = LoadedTensors()
    owner: dict[str, str] = {}
    for f, buf in zip(plan.files, buffers, strict=True):
        for t in f.tensors:
            if t.name in owner:
                raise IntegrityError(
                    f"tensor {t.name!r} appears in both {owner[t.name]} and {f.path}"
                )
            owner[t.name] = f.path
            out[t.name] = tensor_view(buf, t)
    return out


def _report(
    ref: str,
    digest: str,
    dev: torch.device,
    plan: LoadPlan,
    t: StageTotals,
    setup_s: float,
    start: float,
) -> LoadReport:
    return LoadReport(
        ref=ref,
        manifest_digest=digest,
        device=str(dev),
        tensor_bytes=plan.data_bytes,
        chunks=t.chunks,
        fetch=StageReport(t.fetch_bytes, t.fetch_s),
        verify_decompress=StageReport(t.decode_bytes, t.decode_s),
        place=StageReport(t.place_bytes, t.place_s),
        cache_hit_bytes=t.cache_hit_bytes,
        cache_mapped_bytes=t.cache_mapped_bytes,
        store_bytes=t.store_bytes,
        cache_hits=t.cache_hits,
        store_gets=t.store_gets,
        peak_inflight_bytes=t.peak_inflight_bytes,
        setup_s=setup_s,
        wall_s=time.perf_counter() - start,
    )


def load(
    ref: str | Reference,
    device: str | torch.device = "cpu",
    *,
    registry: Registry | None = None,
    source: ChunkSource | None = None,
    cache: DiskCache | None = None,
    config: LoaderConfig | None = None,
) -> LoadedTensors:
    """One-shot ``Snapshotter(...).load``; give ``registry`` or ``source``."""
    return _one_shot(registry, source, cache, config).load(ref, device)


def load_into_module(
    module: torch.nn.Module,
    ref: str | Reference,
    device: str | torch.device = "cpu",
    *,
    registry: Registry | None = None,
    source: ChunkSource | None = None,
    cache: DiskCache | None = None,
    config: LoaderConfig | None = None,
    strict: bool = True,
) -> ModuleLoadResult:
    """One-shot ``Snapshotter(...).load_into_module``."""
    snap = _one_shot(registry, source, cache, config)
    return snap.load_into_module(module, ref, device, strict=strict)


def _one_shot(
    registry: Registry | None,
    source: ChunkSource | None,
    cache: DiskCache | None,
    config: LoaderConfig | None,
) -> Snapshotter:
    if source is not None:
        return Snapshotter(source.registry, config=config, source=source)
    if registry is None:
        raise TypeError("load() needs registry= (or source=) to know where artifacts live")
    return Snapshotter(registry, cache, config)


class _Parsed:
    """Manifests by digest, each with its RAM-tier plan once made; the ``limit`` used
    most recently. Thread-safe. A digest names one content, so what is kept stays true."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._kept: OrderedDict[str, tuple[Manifest, LoadPlan | None]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, digest: str) -> tuple[Manifest, LoadPlan | None] | None:
        with self._lock:
            kept = self._kept.get(digest)
            if kept is not None:
                self._kept.move_to_end(digest)
            return kept

    def put(self, digest: str, manifest: Manifest, plan: LoadPlan | None = None) -> None:
        with self._lock:
            old = self._kept.get(digest)
            self._kept[digest] = (manifest, plan if plan is not None else old and old[1])
            self._kept.move_to_end(digest)
            while len(self._kept) > self.limit:
                self._kept.popitem(last=False)
