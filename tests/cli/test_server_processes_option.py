"""``thaw server --processes`` wins over ``THAW_SERVER_PROCESSES`` in what the app is given
(each process paces its reconcile loop by the count)."""

from __future__ import annotations

from typing import Any

import pytest
import uvicorn

import control_plane.api.app as app_module
from cli.server import server
from control_plane import gil


def test_the_option_wins_over_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.setenv("THAW_SERVER_PROCESSES", "4")
    monkeypatch.setenv("THAW_DATABASE_URL", f"sqlite:///{tmp_path / 'thaw.db'}")
    given: list[Any] = []

    class App:
        class state:
            bootstrap_admin_key = None

    def create_app(settings: Any) -> type[App]:
        given.append(settings)
        return App

    monkeypatch.setattr(app_module, "create_app", create_app)
    monkeypatch.setattr(uvicorn, "run", lambda *a, **kw: None)
    monkeypatch.setattr(gil, "tune", lambda: None)  # this process's switch interval stays
    server(processes=1, log_level="WARNING")
    assert [s.server_processes for s in given] == [1]
