"""The secrets key file made on first use: processes starting together share one key."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from cryptography.fernet import Fernet

from control_plane.services.secrets import key_from_file

MAKE_AND_PRINT = (
    "import sys, time; from pathlib import Path; "
    "from control_plane.services.secrets import key_from_file; "
    "time.sleep(max(0.0, float(sys.argv[2]) - time.time())); "
    "print(key_from_file(Path(sys.argv[1])).decode())"
)


def test_processes_starting_together_all_use_the_key_that_won(tmp_path: Path) -> None:
    path = tmp_path / "home" / "secrets.key"
    start_at = str(time.time() + 2.0)  # after every interpreter has started
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", MAKE_AND_PRINT, str(path), start_at],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(6)
    ]
    keys = {p.communicate(timeout=60)[0].strip() for p in procs}
    assert keys == {path.read_text().strip()}
    Fernet(keys.pop())  # a whole key
    assert sorted(p.name for p in path.parent.iterdir()) == ["secrets.key"]  # no leftovers
    assert path.stat().st_mode & 0o777 == 0o600


def test_an_existing_key_is_read(tmp_path: Path) -> None:
    key = Fernet.generate_key()
    (tmp_path / "secrets.key").write_bytes(key + b"\n")
    assert key_from_file(tmp_path / "secrets.key") == key
