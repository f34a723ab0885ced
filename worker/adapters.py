"""LoRA adapters a replica loads on first use, kept under an LRU cap.

Adapters listed in the function's spec are loaded before the replica is
ready and stay loaded (pinned). A call that names any other adapter
(``NAME:TAG`` or ``NAME``, as pushed with ``thaw models push``) has it
fetched through the replica's snapshotter before the function runs; at most
``cap`` such adapters stay loaded, the least recently used unloaded first.
An adapter a running call uses is never unloaded under it: the cache may sit
above the cap until that call ends.

The function learns of changes through two optional methods on its class:
``load_adapter(adapter)`` after an adapter joins ``ctx.adapters`` and
``unload_adapter(name)`` after one leaves it.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from contextlib import contextmanager
from dataclasses import dataclass

from worker.sdk import Adapter


@dataclass(frozen=True)
class AdapterUse:
    """How a call got its adapter: already loaded (``hit``) or loaded for it."""

    name: str
    hit: bool
    load_ms: float


@dataclass
class AdapterStats:
    hits: int = 0
    misses: int = 0
    load_ms_total: float = 0.0


def adapters_to_evict(
    lru_order: Sequence[str], pinned: AbstractSet[str], in_use: AbstractSet[str], cap: int
) -> list[str]:
    """Adapters to unload so at most ``cap`` unpinned ones remain, oldest first.

    ``lru_order`` is every loaded adapter, least recently used first. Pinned
    adapters are neither counted nor chosen; adapters in use are counted but
    not chosen (the result may leave more than ``cap``).
    """
    on_demand = [name for name in lru_order if name not in pinned]
    excess = len(on_demand) - max(0, cap)
    victims: list[str] = []
    for name in on_demand:
        if excess <= 0:
            break
        if name not in in_use:
            victims.append(name)
            excess -= 1
    return victims


class AdapterCache:
    """The replica's loaded adapters (``adapters`` is the function's ``ctx.adapters``).

    Thread-safe; a load holds the cache's lock, so two calls naming the same
    new adapter load it once (the second waits and is a hit).
    """

    def __init__(
        self,
        adapters: dict[str, Adapter],
        fetch: Callable[[str], Adapter],
        cap: int,
        *,
        on_load: Callable[[Adapter], object] | None = None,
        on_unload: Callable[[str], object] | None = None,
    ) -> None:
        self.adapters = adapters
        self.pinned = frozenset(adapters)
        self.cap = cap
        self.stats = AdapterStats()
        self._fetch = fetch
        self._on_load = on_load
        self._on_unload = on_unload
        self._lru: OrderedDict[str, None] = OrderedDict((name, None) for name in adapters)
        self._in_use: Counter[str] = Counter()
        self._lock = threading.Lock()

    def loaded(self) -> list[str]:
        """Names of the adapters loaded now (pinned and on-demand), sorted."""
        with self._lock:
            return sorted(self.adapters)

    @contextmanager
    def use(self, name: str) -> Iterator[AdapterUse]:
        """Hold ``name`` loaded for the duration of a call; load it first on a miss.

        Raises what the fetch or the function's ``load_adapter`` raised
        (unknown adapter, store errors); then nothing is loaded or held.
        """
        use = self._acquire(name)
        try:
            yield use
        finally:
            self._release(name)

    def _acquire(self, name: str) -> AdapterUse:
        with self._lock:
            hit = name in self.adapters
            t0 = time.perf_counter()
            if not hit:
                self._load_locked(name)
            load_ms = 0.0 if hit else (time.perf_counter() - t0) * 1000
            self._lru[name] = None
            self._lru.move_to_end(name)
            self._in_use[name] += 1
            self.stats.hits += hit
            self.stats.misses += not hit
            self.stats.load_ms_total += load_ms
            self._evict_locked()
        return AdapterUse(name, hit, load_ms)

    def _load_locked(self, name: str) -> None:
        adapter = self._fetch(name)
        self.adapters[name] = adapter
        if self._on_load is not None:
            try:
                self._on_load(adapter)
            except BaseException:
                del self.adapters[name]  # the function does not have it: neither do we
                raise

    def _release(self, name: str) -> None:
        with self._lock:
            self._in_use[name] -= 1
            if self._in_use[name] <= 0:
                del self._in_use[name]
            self._evict_locked()

    def _evict_locked(self) -> None:
        for victim in adapters_to_evict(list(self._lru), self.pinned, set(self._in_use), self.cap):
            del self._lru[victim]
            del self.adapters[victim]
            if self._on_unload is not None:
                self._on_unload(victim)
