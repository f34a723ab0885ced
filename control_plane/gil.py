"""How long a thread keeps the GIL before another waiting one gets it.

Every thaw process passes each call between threads: the HTTP loop and its
request threads, the database, the direct port's readers, a replica's call
threads. Python's default switch interval is 5 ms, and under load each
hand-over can wait it out; 1 ms keeps them short for a few percent more
switching. Measured with ``bench/invoke.py`` (README there).
"""

from __future__ import annotations

import sys

SWITCH_INTERVAL_S = 0.001


def tune() -> None:
    """Set this process's switch interval (call once, at start)."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)
