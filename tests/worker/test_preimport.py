"""Which modules a start imported, and importing them ahead."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from worker.preimport import import_ahead, library_modules_since


def _package(root: Path, name: str) -> None:
    (root / name).mkdir()
    (root / name / "__init__.py").write_text("from . import inner\n")
    (root / name / "inner.py").write_text("VALUE = 1\n")


def test_library_modules_leave_out_the_functions_own_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    libs, code = tmp_path / "site", tmp_path / "bundle"
    libs.mkdir()
    code.mkdir()
    _package(libs, "thaw_test_lib")
    _package(code, "thaw_test_app")
    monkeypatch.syspath_prepend(str(libs))
    monkeypatch.syspath_prepend(str(code))
    before = set(sys.modules)
    try:
        import thaw_test_app  # noqa: F401
        import thaw_test_lib  # noqa: F401

        assert library_modules_since(before, code) == ["thaw_test_lib", "thaw_test_lib.inner"]
    finally:
        for name in (
            "thaw_test_app",
            "thaw_test_app.inner",
            "thaw_test_lib",
            "thaw_test_lib.inner",
        ):
            sys.modules.pop(name, None)


def test_importing_ahead_skips_what_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _package(tmp_path, "thaw_test_ahead")
    (tmp_path / "thaw_test_broken.py").write_text("raise RuntimeError('not here')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert import_ahead(["thaw_test_broken", "thaw_test_ahead", "thaw_test_ahead.inner"]) == 1
        assert "thaw_test_ahead.inner" in sys.modules and "thaw_test_broken" not in sys.modules
    finally:
        for name in ("thaw_test_ahead", "thaw_test_ahead.inner"):
            sys.modules.pop(name, None)
