"""bench/heap.py, one trial each: a frozen start leaves the full collection almost
nothing to visit, and a fork of the zygote keeps its pages shared."""

from __future__ import annotations

from rich.console import Console

from bench.heap import run, table


def test_frozen_processes_visit_and_copy_almost_nothing() -> None:
    rows = run(1, Console(quiet=True))
    by = {(r["process"], r["arm"]): r for r in rows}
    assert set(by) == {(p, a) for p in ("replica", "server") for a in ("as is", "frozen")}
    for process in ("replica", "server"):
        as_is, frozen = by[(process, "as is")], by[(process, "frozen")]
        assert as_is["frozen"] == 0 and as_is["tracked"] > 100_000
        assert frozen["frozen"] > 100_000 and frozen["tracked"] < 1_000
    # torch, transformers and peft's objects: collecting them copies their pages.
    assert by[("replica", "as is")]["copied_mib"] > 32
    assert by[("replica", "frozen")]["copied_mib"] < 8
    assert len(table(rows).rows) == 4
