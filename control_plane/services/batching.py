"""Batch sizes the replicas of batched functions actually form, as metrics.

The worker reports on each call of a batch its ``batch_size`` and
``batch_index`` (``protocol.CallEvent``); a batch is counted once, from the
final event of its call at index 0, in ``thaw_batch_size``. The function's
configured ``max_batch_size`` is beside it in ``thaw_batch_size_max``
(``services.function_gauges``), so a dashboard shows how full the batches run.
"""

from __future__ import annotations

from control_plane.metrics import Metrics
from control_plane.protocol import FINAL_CALL_EVENTS, CallEvent


def counts_batch(ev: CallEvent) -> bool:
    """Whether this event is the one that stands for its batch."""
    return ev.kind in FINAL_CALL_EVENTS and ev.batch_size is not None and ev.batch_index == 0


def observe(metrics: Metrics | None, function: str, ev: CallEvent) -> None:
    """Count the batch ``ev`` stands for (if it does)."""
    if metrics is None or not counts_batch(ev):
        return
    assert ev.batch_size is not None
    metrics.batch_size.labels(function).observe(ev.batch_size)
