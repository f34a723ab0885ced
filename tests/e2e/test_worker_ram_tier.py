"""The host-RAM tier's lifetime with real ``thaw worker`` processes: the default tier
(``/dev/shm/thaw-<home hash>``) goes with the home's last worker, a tier the user
set stays. Asserted before the stack's teardown, which removes a killed worker's."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.e2e.stack import Backend, Proc, Stack

pytestmark = pytest.mark.slow

# No preloaded pool: these workers run no function, they only start and stop.
LIGHT_WORKER = {"THAW_WORKER_POOL_SIZE": "0", "THAW_WORKER_POOL_PRELOAD": ""}


@contextmanager
def embedded_stack(tmp: Path, **settings: str) -> Iterator[Stack]:
    """``thaw server`` on SQLite and the filesystem broker, no worker yet."""
    backend = Backend("embedded", f"sqlite:///{tmp / 'thaw.db'}", None)
    stack = Stack(tmp / "stack", backend, tmp / "store", settings={**LIGHT_WORKER, **settings})
    try:
        stack.start_server()
        yield stack
    finally:
        stack.stop()


@pytest.fixture
def user_tier() -> Iterator[Path]:
    """A directory the user set as THAW_RAM_TIER_DIR, on the tmpfs when there is one."""
    shm = Path("/dev/shm")
    parent = shm if shm.is_dir() else None
    directory = Path(tempfile.mkdtemp(prefix="thaw-test-user-tier-", dir=parent))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def stop_cleanly(proc: Proc) -> None:
    proc.stop()
    assert proc.popen.returncode == 0, f"{proc.name} did not stop cleanly"


def test_the_homes_last_worker_to_stop_removes_its_default_ram_tier(tmp_path: Path) -> None:
    with embedded_stack(tmp_path) as stack:
        tier = stack.default_ram_tier()
        assert not tier.exists()
        w1, w2 = stack.start_worker("w1"), stack.start_worker("w2")
        assert (tier / "entries").is_dir()  # one tier, shared by the home's workers

        stop_cleanly(w1)
        assert (tier / "entries").is_dir(), "removed while w2 still uses it"
        stop_cleanly(w2)
        assert not tier.exists(), f"{tier} outlived the workers of its home"
        assert not list(tier.parent.glob(f"{tier.name}*"))  # nor a half-removed copy


def test_a_ram_tier_set_by_the_user_outlives_its_workers(tmp_path: Path, user_tier: Path) -> None:
    with embedded_stack(tmp_path, THAW_RAM_TIER_DIR=str(user_tier)) as stack:
        worker = stack.start_worker("w1")
        assert (user_tier / "entries").is_dir()
        stop_cleanly(worker)
        assert (user_tier / "entries").is_dir()
        assert not stack.default_ram_tier().exists()  # not used, so not created
