"""Per-function gauges the alert rules join on (deploy/prometheus/thaw-alerts.yml).

``thaw_function_target_concurrency`` is the active version's target concurrency
(queue depth per replica is judged against it); ``thaw_function_deployed_timestamp_seconds``
is when the active version was deployed (a cold-start jump soon after it points
at the new version). ``thaw_batch_size_max`` is a batched function's configured
``max_batch_size``, beside the batch sizes it forms (``services.batching``).
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from control_plane.db.models import Function, FunctionVersion
from control_plane.metrics import Metrics, set_series
from control_plane.services import functions


def refresh_function_gauges(session: Session, m: Metrics) -> None:
    """Set the gauges of every function with an active version, in place; then drop
    the labels of functions without one (a concurrent scrape never misses a live one)."""
    rows = session.execute(
        select(Function.name, FunctionVersion.created_at)
        .join(FunctionVersion, FunctionVersion.function_id == Function.id)
        .where(FunctionVersion.version == Function.active_version)
    ).all()
    concurrency: dict[tuple[str, ...], float] = {}
    deployed_at: dict[tuple[str, ...], float] = {}
    batch_max: dict[tuple[str, ...], float] = {}
    for name, created_at in rows:
        spec = functions.active(session, name).spec
        concurrency[(name,)] = spec.scaling.target_concurrency
        deployed_at[(name,)] = created_at
        if spec.batching is not None:
            batch_max[(name,)] = spec.batching.max_batch_size
    set_series(m.function_target_concurrency, concurrency)
    set_series(m.function_deployed_at_s, deployed_at)
    set_series(m.batch_size_max, batch_max)
