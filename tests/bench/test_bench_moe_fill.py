"""bench/moe_fill.py: a mixture of experts pushed as saved against converted, on a
tiny Mixtral; the table shows the converted push's fill holding the model's state once."""

from __future__ import annotations

import pytest

from bench import moe_fill


def test_a_quick_run_shows_both_pushes(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--hidden", "32", "--experts", "4", "--layers", "1", "--trials", "1"]
    assert moe_fill.main(args) == 0
    rows = {
        line.split()[1]: line.split()
        for line in capsys.readouterr().out.splitlines()
        if "│" in line
    }
    assert float(rows["converted"][5]) == 1.0  # held / state: the state once
    assert float(rows["as"][6]) > 1.2  # "as saved": the experts' stacks beside the buffer
