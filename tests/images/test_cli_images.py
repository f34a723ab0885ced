"""`thaw images push` through typer's CliRunner: a saved archive, and the local engine."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from snapshotter.config import StoreConfig
from snapshotter.images import get_image, resolve_image
from snapshotter.registry import Registry
from snapshotter.stores import open_store
from tests.fixtures.images import Member, docker_available, layer_tar, save_archive


def _thaw(tmp_path: Path, *args: str) -> tuple[int, str]:
    env = {"THAW_HOME": str(tmp_path / "home"), "THAW_STORE": str(tmp_path / "store")}
    result = CliRunner().invoke(app, list(args), env={**env, "COLUMNS": "200"})
    return result.exit_code, result.output


def _registry(tmp_path: Path) -> Registry:
    return Registry(open_store(StoreConfig(url=str(tmp_path / "store"))))


def test_push_archive_then_again_dedups(tmp_path: Path) -> None:
    archive = tmp_path / "img.tar"
    archive.write_bytes(save_archive([layer_tar([Member("app/main.py", data=b"print(1)\n")])]))
    code, output = _thaw(tmp_path, "images", "push", "myapp:v1", "--archive", str(archive))
    assert code == 0, output
    assert "pushed image myapp:v1" in output
    assert "1 new" in output
    code, output = _thaw(tmp_path, "images", "push", "myapp:v2", "--archive", str(archive))
    assert code == 0, output
    assert "0 new, 1 deduplicated" in output
    registry = _registry(tmp_path)
    one, two = (get_image(registry, resolve_image(registry, r)) for r in ("myapp:v1", "myapp:v2"))
    assert one.layers == two.layers


def test_refused_entry_is_one_red_line(tmp_path: Path) -> None:
    archive = tmp_path / "bad.tar"
    archive.write_bytes(save_archive([layer_tar([Member("/etc/passwd", data=b"x")])]))
    code, output = _thaw(tmp_path, "images", "push", "bad:v1", "--archive", str(archive))
    assert code == 2
    assert "error:" in output
    assert "'/etc/passwd'" in output
    assert "Traceback" not in output


def test_missing_local_image_is_reported(tmp_path: Path) -> None:
    if not docker_available():
        pytest.skip("no Docker engine (make system-deps starts one)")
    code, output = _thaw(tmp_path, "images", "push", "thaw-no-such-image:v0")
    assert code == 2
    assert "not in the local Docker engine" in output


def test_push_from_the_local_engine(tmp_path: Path, docker_base_image: str) -> None:
    code, output = _thaw(tmp_path, "images", "push", docker_base_image)
    assert code == 0, output
    image = get_image(_registry(tmp_path), resolve_image(_registry(tmp_path), docker_base_image))
    assert len(image.layers) == 1
    assert image.config.cmd == ("/bin/sh",)
