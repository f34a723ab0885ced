"""Per-function gauges the alert rules join on (deploy/prometheus/thaw-alerts.yml).

``thaw_function_target_concurrency`` is the active version's target concurrency
(queue depth per replica is judged against it); ``thaw_function_deployed_timestamp_seconds``
is when the active version was deployed (a cold-start jump soon after it points
at the new version).
"""

from __future__ import annotations

from prometheus_client import Gauge
from sqlalchemy import select
from sqlalchemy.orm import Session

from control_plane.db.models import Function, FunctionVersion
from control_plane.metrics import Metrics
from control_plane.services import functions


def refresh_function_gauges(session: Session, m: Metrics) -> None:
    """Set both gauges for every function with an active version, in place; then drop
    the labels of functions without one (a concurrent scrape never misses a live one)."""
    rows = session.execute(
        select(Function.name, FunctionVersion.created_at)
        .join(FunctionVersion, FunctionVersion.function_id == Function.id)
        .where(FunctionVersion.version == Function.active_version)
    ).all()
    live: set[tuple[str, ...]] = set()
    for name, created_at in rows:
        spec = functions.active(session, name).spec
        m.function_target_concurrency.labels(name).set(spec.scaling.target_concurrency)
        m.function_deployed_at_s.labels(name).set(created_at)
        live.add((name,))
    for gauge in (m.function_target_concurrency, m.function_deployed_at_s):
        for labels in _label_sets(gauge) - live:
            gauge.remove(*labels)


def _label_sets(gauge: Gauge) -> set[tuple[str, ...]]:
    return {tuple(s.labels.values()) for metric in gauge.collect() for s in metric.samples}
