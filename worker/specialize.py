"""Turn a generic replica process into one function's replica.

Runs in the child, after the generic start. Steps, each timed as the cold
start phase of the same name: load the code (``imports``), stream the
model's weights (``weights_fetch``, ``weights_to_device``), load the
adapters (``adapters``), run the user's ``setup`` (``user_setup``).

On any failure ``SpecializeError`` carries the message, the traceback tail
and the phases measured up to that point.

A pooled process may bring a ``WeightLoader`` built ahead (``prepare``): it
is used when it reads the same store as the spec. Adapters a call names but
the spec does not list are loaded on first use (``worker.adapters``).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from snapshotter.errors import NotFoundError
from snapshotter.manifest import ArtifactKind
from worker import log_guard
from worker.adapters import AdapterCache
from worker.artifacts import (
    LoadedWeights,
    WeightLoader,
    materialize,
    open_registry,
    read_json_file,
)
from worker.child_protocol import LoadStats, ReplicaSpec, StoreSpec
from worker.preimport import library_modules_since
from worker.profiling import FirstCallProfile
from worker.sdk import Adapter, Context, accepts_call_context

TRACEBACK_TAIL_LINES = 12
MAX_ERROR_CHARS = 4000


class SpecializeError(Exception):
    def __init__(self, message: str, phases_ms: dict[str, float]) -> None:
        super().__init__(message)
        self.phases_ms = phases_ms


@dataclass
class Specialized:
    """A ready replica: the user's instance and how to call it."""

    instance: Any
    ctx: Context
    pass_call_context: bool
    phases_ms: dict[str, float] = field(default_factory=dict)
    profile: FirstCallProfile | None = None
    adapters: AdapterCache | None = None  # None: no store to fetch adapters from
    loads: list[LoadStats] = field(default_factory=list)
    imports: list[str] = field(default_factory=list)  # library modules the start imported


def format_error(exc: BaseException) -> str:
    """``Type: message`` then the last lines of the traceback, capped in size."""
    tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
    tail = "".join(tb).rstrip().splitlines()[-TRACEBACK_TAIL_LINES:]
    text = f"{type(exc).__name__}: {exc}\n" + "\n".join(tail)
    return text[-MAX_ERROR_CHARS:]


@contextmanager
def _phase(phases_ms: dict[str, float], name: str) -> Iterator[None]:
    t0 = time.perf_counter()
    try:
        yield
    finally:
        phases_ms[name] = phases_ms.get(name, 0.0) + (time.perf_counter() - t0) * 1000


def specialize(spec: ReplicaSpec, loader: WeightLoader | None = None) -> Specialized:
    """Load code, weights and adapters and run ``setup``. Raises ``SpecializeError``.

    ``loader`` (a pooled process's, built ahead) is used when it reads ``spec.store``.
    """
    phases_ms: dict[str, float] = {}
    loaders = _Loaders(spec.store, loader)
    try:
        return _specialize(spec, loaders, phases_ms)
    except Exception as exc:
        raise SpecializeError(format_error(exc), phases_ms) from exc


class _Loaders:
    """The replica's one ``WeightLoader``, made on first use."""

    def __init__(self, store: StoreSpec | None, ready: WeightLoader | None) -> None:
        self.store = store
        self._loader = ready if ready is not None and ready.spec == store else None
        self._stale = self._loader is not None

    def get(self) -> WeightLoader:
        """The loader; one built ahead first re-reads the disk cache index (once)."""
        if self._loader is None:
            if self.store is None:
                raise ValueError("the replica spec names weights but no store to read them from")
            self._loader = WeightLoader(open_registry(self.store), self.store)
        elif self._stale:
            self._loader.refresh_cache_index()
        self._stale = False
        return self._loader

    def loads(self) -> list[LoadStats]:
        return list(self._loader.loads) if self._loader is not None else []


def _specialize(spec: ReplicaSpec, loaders: _Loaders, phases_ms: dict[str, float]) -> Specialized:
    before = set(sys.modules)
    if spec.device == "cpu" and spec.cpu_threads is not None:
        import torch

        torch.set_num_threads(spec.cpu_threads)  # before any user code or engine starts
    os.environ.update(spec.env)  # the function's declared environment, for its own code
    secrets = {n: spec.env[n] for n in spec.secret_names if n in spec.env}
    log_guard.install(secrets, spec.max_log_bytes_per_call)  # before any user code runs
    with _phase(phases_ms, "imports"):
        code = code_dir(spec)
        cls = load_entry(code, spec.entry)
    ctx = Context(device=spec.device, function=spec.function, replica_id=spec.replica_id)
    profile = None
    if spec.model_digest or spec.adapters:
        with _phase(phases_ms, "weights_fetch"):  # opening the store and caches
            loader = loaders.get()
        profile = _load_model_and_adapters(spec, loader, ctx, phases_ms)
    with _phase(phases_ms, "user_setup"):
        llm = spec.llm  # worker.llm.function: its options and the cores it may take
        instance = cls(llm, cpu_cores=spec.cpu_cores) if llm is not None else cls()
        setup = getattr(instance, "setup", None)
        if setup is not None:
            setup(ctx)
    _check_entry_points(spec, instance)
    cache = None
    if spec.store is not None:
        cache = AdapterCache(
            ctx.adapters,
            adapter_fetcher(loaders.get, spec.device),
            spec.adapter_cache_size,
            on_load=getattr(instance, "load_adapter", None),
            on_unload=getattr(instance, "unload_adapter", None),
        )
    takes_call = callable(instance) and accepts_call_context(instance.__call__)
    imports = library_modules_since(before, code.resolve())
    return Specialized(
        instance, ctx, takes_call, phases_ms, profile, cache, loaders.loads(), imports
    )


def _check_entry_points(spec: ReplicaSpec, instance: Any) -> None:
    """A batched function needs ``batch(inputs)``; any other needs ``__call__(input)``."""
    if spec.max_batch_size is not None:
        if not callable(getattr(instance, "batch", None)):
            raise TypeError(
                f"{spec.function} asks for [batching] but {spec.entry} has no "
                "batch(self, inputs) method; add one (see worker/sdk.py) or remove [batching]"
            )
    elif not callable(instance):
        raise TypeError(f"{spec.entry} instances are not callable; define __call__(self, input)")


def adapter_fetcher(loader: Callable[[], WeightLoader], device: str) -> Callable[[str], Adapter]:
    """Fetch an adapter by reference (``NAME:TAG``, ``NAME`` or a digest) onto ``device``."""

    def fetch(ref: str) -> Adapter:
        snap = loader().snapshotter
        try:
            digest, manifest = snap.resolve(ref)
        except (NotFoundError, ValueError) as exc:
            raise LookupError(
                f"adapter {ref!r} is not listed by the function and not in the store ({exc}); "
                "push it with `thaw models push` or list it in thaw.toml"
            ) from None
        if manifest.kind is not ArtifactKind.ADAPTER:
            raise ValueError(f"{ref!r} is a {manifest.kind.value}, not a LoRA adapter")
        tensors = loader().load(digest, device).tensors
        config = json.loads(snap.read_file(digest, "adapter_config.json"))
        return Adapter(ref, tensors, config)

    return fetch


def code_dir(spec: ReplicaSpec) -> Path:
    if spec.bundle_dir:
        return Path(spec.bundle_dir)
    if not spec.bundle_digest or spec.store is None:
        raise ValueError("the replica spec names neither a bundle digest nor a code directory")
    registry = open_registry(spec.store)
    bundles = Path(spec.store.bundles_dir)
    return materialize(registry, spec.bundle_digest, bundles, include_tensors=True)


def load_entry(directory: Path, entry: str) -> type:
    """Import ``module:ClassName`` from ``directory``."""
    module_name, sep, class_name = entry.partition(":")
    if not sep or not module_name or not class_name:
        raise ValueError(f"entry {entry!r} is not 'module:ClassName'")
    sys.path.insert(0, str(directory))
    module = importlib.import_module(module_name)
    try:
        cls = getattr(module, class_name)
    except AttributeError:
        raise AttributeError(
            f"module {module_name!r} in the bundle has no {class_name!r}; "
            "check `entry` in thaw.toml"
        ) from None
    if not isinstance(cls, type):
        raise TypeError(f"{entry} is a {type(cls).__name__}, expected a class")
    return cls


def _load_model_and_adapters(
    spec: ReplicaSpec, loader: WeightLoader, ctx: Context, phases_ms: dict[str, float]
) -> FirstCallProfile | None:
    assert spec.store is not None  # the loader was made from it
    registry = loader.registry
    profile = None
    if spec.model_digest:
        files_root = Path(spec.store.bundles_dir) / "models"
        ctx.files = materialize(registry, spec.model_digest, files_root)
        # Through the RAM tier and the disk cache: a re-warm asks the store for nothing.
        _digest, manifest = loader.snapshotter.resolve(spec.model_digest)
        ctx.config = read_json_file(registry, manifest, "config.json")
        weights = loader.load(spec.model_digest, spec.device)
        _add_phases(phases_ms, weights)
        ctx.weights = weights.tensors
        profile = FirstCallProfile(registry, spec.model_digest)
        ctx.on_fill = profile.watch
    with _phase(phases_ms, "adapters"):
        for ref in spec.adapters:
            loaded = loader.load(ref.digest, spec.device)
            _digest, manifest = loader.snapshotter.resolve(ref.digest)
            config = read_json_file(registry, manifest, "adapter_config.json")
            ctx.adapters[ref.name] = Adapter(ref.name, loaded.tensors, config)
    return profile


def _add_phases(phases_ms: dict[str, float], weights: LoadedWeights) -> None:
    for name, ms in weights.phases_ms.items():
        phases_ms[name] = phases_ms.get(name, 0.0) + ms
