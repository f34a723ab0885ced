"""Process trees and their CPU time, read from /proc."""

from __future__ import annotations

import subprocess
import sys
import time

from bench import _cpu

SPIN = "import time\nend = time.process_time() + 30\nwhile time.process_time() < end: pass\n"
# A parent that only waits for its child, which burns CPU.
PARENT = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {SPIN!r}])\n"


def test_a_tree_below_a_process_is_found_and_its_cpu_counted() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT])
    try:
        deadline = time.monotonic() + 30
        while not (below := _cpu.descendants(parent.pid)):
            assert time.monotonic() < deadline, "the child never appeared"
            time.sleep(0.01)
        meter = _cpu.TreeMeter({"parent": [parent.pid], "below": below})
        time.sleep(0.5)
        spent = meter.spent_s()
    finally:
        for pid in _cpu.descendants(parent.pid):
            subprocess.run(["kill", str(pid)], check=False)
        parent.kill()
        parent.wait()
    assert spent["below"] > 0.1, spent  # the spinning child, found under its parent
    assert spent["parent"] < 0.1, spent  # a process's own CPU, not its children's


def test_a_process_gone_counts_zero() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert _cpu.cpu_s([child.pid]) == 0.0
