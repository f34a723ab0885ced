"""Smoke test of bench/image.py: quick mode runs every row and prints one JSON object."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
REPO = Path(__file__).resolve().parents[2]


def test_quick_run_reports_every_row(engine_image: str, tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(REPO / "bench" / "image.py"), "--quick", "--json", "-",
         "--data-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=850, cwd=REPO,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout)
    assert set(doc["rows"]) == {"pull+extract", "lazy", "lazy+profile"}
    assert 0 < doc["bytes_fraction"] < 1
    assert doc["speedup"] > 0
    assert doc["rows"]["pull+extract"]["fetched_bytes"] == doc["image_bytes"]
    subprocess.run(["docker", "rmi", "-f", "thaw-bench-big:64mb"], capture_output=True)
