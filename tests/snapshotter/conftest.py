"""Fixtures shared by the snapshotter's tests."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from snapshotter.config import RamTierConfig

_SHM = Path("/dev/shm")


@pytest.fixture
def tier_config() -> Iterator[RamTierConfig]:
    """A fresh RAM-tier directory on the real tmpfs when there is one."""
    parent = _SHM if _SHM.is_dir() else None
    directory = Path(tempfile.mkdtemp(prefix="thaw-test-ram-", dir=parent))
    yield RamTierConfig(directory=directory, max_bytes=256 << 20)
    shutil.rmtree(directory, ignore_errors=True)
