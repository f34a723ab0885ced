"""Record a replica's first forward pass as its model's prefetch profile.

When ``setup`` builds its model with ``ctx.fill_module``, the module is
watched (``snapshotter.profile.ModuleAccessRecorder``). After the replica's
first successful call the hooks are removed and the order in which tensors
were first used is stored next to the model's manifest, so the next cold
start on any worker fetches those chunks first. A failure to save costs
only ordering: it is logged, never raised into a call.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from snapshotter.registry import Registry

log = logging.getLogger(__name__)


class FirstCallProfile:
    """Watches modules filled from one manifest; saves their access order once."""

    def __init__(self, registry: Registry, manifest_digest: str) -> None:
        self.registry = registry
        self.manifest_digest = manifest_digest
        self._recorders: list[Any] = []
        self._lock = threading.Lock()
        self._done = False

    def watch(self, module: Any) -> None:
        from snapshotter.profile import ModuleAccessRecorder

        with self._lock:
            if not self._done:
                self._recorders.append(ModuleAccessRecorder(module).__enter__())

    def save_once(self) -> list[str] | None:
        """Stop watching and store the order (when it changed); the order saved, or None."""
        with self._lock:
            if self._done:
                return None
            self._done = True
            recorders, self._recorders = self._recorders, []
        order: dict[str, None] = {}
        for recorder in recorders:
            recorder.__exit__(None, None, None)
            order.update(dict.fromkeys(recorder.order))
        if not order:
            return None
        names = list(order)
        try:
            if self.registry.get_profile(self.manifest_digest) != names:
                self.registry.put_profile(self.manifest_digest, names)
        except Exception:
            log.exception("could not save the prefetch profile of %s", self.manifest_digest)
            return None
        return names
