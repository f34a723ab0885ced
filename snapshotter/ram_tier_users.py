"""The workers using a RAM tier directory, so that the last one to stop removes it.

Only for a tier whose directory thaw chose (``RamTierConfig.remove_when_unused``,
see ``Settings.ram_tier_config``): a directory the user configured is theirs and
no worker removes it.

Protocol, over ``<tier>/.users`` (a lock file, no content)::

    join:   mkdir -p <tier>; open .users; flock(LOCK_SH)    held while the worker runs
            .users at the path is still the file we locked?  no: join again
    leave:  flock(LOCK_EX | LOCK_NB)                         someone else holds LOCK_SH:
                                                             close, keep the tier
            rename <tier> -> <tier>.removing-<uuid>; close; rm -r the renamed directory

Contracts:

- The kernel drops a process's lock when the process dies, however it dies: a
  SIGKILLed worker stops counting as a user. Its tier stays (as a crash leaves
  it) until the next worker on the same home joins it and leaves last.
- A worker joining while another leaves never ends up in a removed directory:
  the tier is renamed away under the exclusive lock, so a joiner that was
  waiting for its shared lock finds ``.users`` gone from the path and joins
  again, creating a fresh directory.
- Replica processes map entries and may still hold them when the tier is
  removed; unlinked tmpfs files stay valid for their mappings.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import uuid
from pathlib import Path

from snapshotter.errors import StoreError

USERS_FILE = ".users"


class TierUser:
    """This process's use of a tier directory, from ``join`` until ``leave``."""

    def __init__(self, directory: Path, fd: int) -> None:
        self.directory = directory
        self._fd: int | None = fd

    @classmethod
    def join(cls, directory: Path) -> TierUser:
        """Create ``directory`` if needed and count this process among its users."""
        path = directory / USERS_FILE
        while True:
            try:
                directory.mkdir(parents=True, exist_ok=True)
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as exc:
                raise StoreError(
                    f"cannot create the RAM tier at {directory}: {exc}; point "
                    "THAW_RAM_TIER_DIR at a writable tmpfs directory, or set "
                    "THAW_RAM_TIER_MAX_BYTES=0 to turn it off"
                ) from exc
            try:
                fcntl.flock(fd, fcntl.LOCK_SH)
                if _is_file_at(fd, path):
                    return cls(directory, fd)
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)  # the tier was removed while we waited: join a fresh one

    def leave(self) -> bool:
        """Stop using the tier; remove it when no other process uses it.

        Returns whether this call removed it. Idempotent.
        """
        fd, self._fd = self._fd, None
        if fd is None:
            return False
        try:
            removing = self._take_away(fd)
        finally:
            os.close(fd)  # a joiner waiting for its lock finds .users gone and joins again
        if removing is None:
            return False
        shutil.rmtree(removing, ignore_errors=True)
        return True

    def _take_away(self, fd: int) -> Path | None:
        """Rename the tier out of its path when no other process uses it; its new path."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None  # another worker uses it: it removes the tier when it leaves
        removing = self.directory.with_name(f"{self.directory.name}.removing-{uuid.uuid4().hex}")
        try:
            self.directory.rename(removing)
        except FileNotFoundError:  # someone emptied the tmpfs (a reboot, an operator)
            return None
        return removing


def _is_file_at(fd: int, path: Path) -> bool:
    try:
        at_path = path.stat()
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (at_path.st_dev, at_path.st_ino)
