"""Library modules a replica's start imported, imported ahead by the next pooled process.

A function's start imports what its model needs on first use: transformers'
modeling module for the architecture, PEFT's tuner code, the tokenizer's
backend. Every replica paid that again (~15-20 ms of the example's
``user_setup`` on two CPUs). A replica reports the modules its start added
that live outside its code bundle; the worker hands that list to the pooled
processes it prepares next, which import them while they wait, as the loader
learns a model's chunk order from the start before.

Importing ahead is best effort: a module that fails to import is skipped,
and the replica imports it (and reports the error) itself, as before.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterable
from pathlib import Path

MAX_MODULES = 2000  # a report's cap: the names, not the imports, travel in messages


def library_modules_since(before: set[str], code_dir: Path) -> list[str]:
    """Modules imported since ``before`` was taken, from files outside ``code_dir``
    (the function's own code is not importable before its bundle is known)."""
    names = []
    for name, module in list(sys.modules.items()):
        if name in before or module is None:
            continue
        origin = getattr(getattr(module, "__spec__", None), "origin", None)
        if not isinstance(origin, str) or origin in ("built-in", "frozen"):
            continue
        if Path(origin).is_relative_to(code_dir):
            continue
        names.append(name)
    return sorted(names)[:MAX_MODULES]  # a parent package sorts before its modules


def import_ahead(names: Iterable[str]) -> int:
    """Import ``names`` not imported yet; how many failed (skipped)."""
    failed = 0
    for name in names:
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except Exception:  # best effort: the replica imports (and reports) it itself
            failed += 1
    return failed
