"""The clock every service takes: unix seconds as a float. Tests pass a fake."""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], float]


def system_clock() -> float:
    return time.time()
