"""Statistics and tables shared by the commands that measure (``thaw loadtest``) and
the benchmarks in ``bench/`` (which import them from here)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from rich.console import Console
from rich.table import Table


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (``q`` in [0, 100]) of a non-empty sequence."""
    if not values:
        raise ValueError("percentile of no values: run at least one trial")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass
class Column:
    header: str
    justify: str = "right"


@dataclass
class TableSpec:
    title: str
    columns: list[Column]
    rows: list[list[str]] = field(default_factory=list)
    caption: str | None = None


def render_table(spec: TableSpec, console: Console) -> None:
    table = Table(title=spec.title, caption=spec.caption)
    for col in spec.columns:
        table.add_column(col.header, justify=col.justify)  # type: ignore[arg-type]
    for row in spec.rows:
        table.add_row(*row)
    console.print(table)
