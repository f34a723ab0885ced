"""The users of a RAM tier directory: the last to leave removes it. Other users are
real processes, counted by the kernel's flock as a worker's would be."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from snapshotter.errors import StoreError
from snapshotter.ram_tier_users import USERS_FILE, TierUser

REPO_ROOT = Path(__file__).resolve().parents[2]

# Joins the tier named by argv[1], says so, and leaves when its stdin closes.
_OTHER_USER = """
import sys
from pathlib import Path
from snapshotter.ram_tier_users import TierUser
user = TierUser.join(Path(sys.argv[1]))
print("joined", flush=True)
sys.stdin.read()
print("removed" if user.leave() else "kept", flush=True)
"""


@contextmanager
def other_user(directory: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process using ``directory``, until the block ends or it is killed."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _OTHER_USER, str(directory)],
        cwd=REPO_ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "joined\n"
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()


def leave(proc: subprocess.Popen[str]) -> str:
    """Close the other user's stdin: it leaves, and says whether it removed the tier."""
    out, _ = proc.communicate(timeout=30)
    return out.strip()


def test_the_only_user_removes_the_tier_when_it_leaves(tmp_path: Path) -> None:
    tier = tmp_path / "thaw-tier"
    user = TierUser.join(tier)
    (tier / "entries").mkdir()
    assert user.leave() is True
    assert list(tmp_path.iterdir()) == []  # the tier, and no renamed leftover
    assert user.leave() is False  # leaving twice is harmless


def test_the_tier_stays_while_another_process_uses_it(tmp_path: Path) -> None:
    tier = tmp_path / "thaw-tier"
    mine = TierUser.join(tier)
    with other_user(tier) as proc:
        assert mine.leave() is False
        assert tier.is_dir()
        assert leave(proc) == "removed"  # the last user
    assert not tier.exists()


def test_the_last_user_is_the_one_still_running_whoever_joined_first(tmp_path: Path) -> None:
    tier = tmp_path / "thaw-tier"
    with other_user(tier) as proc:
        mine = TierUser.join(tier)
        assert leave(proc) == "kept"
        assert tier.is_dir()
        assert mine.leave() is True
    assert not tier.exists()


def test_a_killed_user_no_longer_counts(tmp_path: Path) -> None:
    tier = tmp_path / "thaw-tier"
    with other_user(tier) as proc:
        mine = TierUser.join(tier)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert mine.leave() is True
    assert not tier.exists()


def test_a_killed_last_user_leaves_the_tier_to_the_next_one(tmp_path: Path) -> None:
    tier = tmp_path / "thaw-tier"
    with other_user(tier) as proc:
        (tier / "entries").mkdir()
        proc.send_signal(signal.SIGKILL)
    assert (tier / "entries").is_dir()  # as a crash leaves it
    next_user = TierUser.join(tier)
    assert (tier / "entries").is_dir()  # joined, not recreated
    assert next_user.leave() is True
    assert not tier.exists()


def test_a_join_during_a_removal_gets_a_fresh_tier(tmp_path: Path) -> None:
    tier = tmp_path / "thaw-tier"
    tier.mkdir()
    (tier / "old").write_text("removed with the tier")
    # A leaver midway: it holds .users exclusively, as leave() does until the rename.
    leaver = os.open(tier / USERS_FILE, os.O_RDWR | os.O_CREAT)
    fcntl.flock(leaver, fcntl.LOCK_EX)
    joined: list[TierUser] = []
    joiner = threading.Thread(target=lambda: joined.append(TierUser.join(tier)))
    joiner.start()
    joiner.join(0.2)
    assert joiner.is_alive()  # waits for the leaver's lock
    tier.rename(tmp_path / "removing")
    os.close(leaver)
    joiner.join(10)
    [user] = joined
    assert sorted(p.name for p in tier.iterdir()) == [USERS_FILE]  # fresh, and used
    assert user.leave() is True
    assert not tier.exists()


def test_an_unwritable_place_is_a_store_error_naming_the_way_out(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(StoreError, match="THAW_RAM_TIER_DIR"):
        TierUser.join(blocker / "tier")
