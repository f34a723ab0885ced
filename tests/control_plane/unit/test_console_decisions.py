"""Pure helpers behind the console's endpoints: percentiles, status, sharing, upload paths."""

from __future__ import annotations

from pathlib import PurePosixPath

import pytest
from hypothesis import given
from hypothesis import strategies as st

from control_plane.errors import BadRequestError
from control_plane.services.catalog_usage import dedup_summary
from control_plane.services.stats import percentile, status_of, summarize
from control_plane.services.uploads import common_root, safe_relative


def test_percentile_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 95) == 95.0
    assert percentile([7.0], 95) == 7.0
    assert percentile([], 50) is None
    assert summarize([3.0, 1.0, 2.0]).p50_ms == 2.0


@given(st.lists(st.floats(0, 1e6), min_size=1, max_size=50), st.floats(0, 100))
def test_percentile_is_an_observed_value_and_monotone(values: list[float], q: float) -> None:
    p = percentile(values, q)
    assert p in values
    assert p is not None and p <= (percentile(values, 100) or 0)


def test_status_of() -> None:
    assert status_of(None, {}) == "no-version"
    assert status_of(1, {"ready": 1, "starting": 1}) == "serving"
    assert status_of(1, {"pending": 1}) == "starting"
    assert status_of(1, {"draining": 1}) == "scaled-to-zero"


def test_dedup_summary_counts_only_chunks_held_twice() -> None:
    shared = dedup_summary(
        {
            "m1": {"a": 10, "b": 5},
            "m2": {"a": 10, "c": 7},
            "m3": {"d": 1},
        }
    )
    assert shared == {"m1": 10, "m2": 10, "m3": 0}


@pytest.mark.parametrize("bad", ["", "/etc/passwd", "a/../b", "../x", "..", "x/.."])
def test_safe_relative_refuses_escapes(bad: str) -> None:
    with pytest.raises(BadRequestError, match="not a plain relative path"):
        safe_relative(bad)


def test_common_root_strips_the_chosen_folder_only() -> None:
    picked = [PurePosixPath("llama/config.json"), PurePosixPath("llama/sub/x.bin")]
    assert common_root(picked) == 1
    assert common_root([PurePosixPath("config.json"), PurePosixPath("a/b")]) == 0
    assert common_root([PurePosixPath("a/x"), PurePosixPath("b/y")]) == 0
    assert safe_relative("llama\\config.json") == PurePosixPath("llama/config.json")
