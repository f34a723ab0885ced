"""Hostile JSON in the files a push reads (issue 24, part 6): a real ``thaw models
push`` process refuses each with one line on stderr naming the file and what was
wrong, exit code 2, no traceback, nothing stored (``snapshotter.json_doc``)."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

DEPTH = 100_000
DEEP = b"[" * DEPTH + b"]" * DEPTH


def _deep_header_shard(path: Path) -> None:
    header = b'{"w":' + DEEP + b"}"
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(8))


def _model(tmp_path: Path, llama_dir: Path) -> Path:
    model = tmp_path / "model"
    shutil.copytree(llama_dir, model)
    return model


def _push(tmp_path: Path, model: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("THAW_")}
    env.update(THAW_HOME=str(tmp_path / "home"), THAW_STORE=str(tmp_path / "store"))
    env["COLUMNS"] = "100"  # the line must stay one line however narrow the terminal
    return subprocess.run(
        [sys.executable, "-m", "cli.main", "models", "push", str(model), "hostile:v1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _assert_refused_in_one_line(result: subprocess.CompletedProcess[str], *says: str) -> None:
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr + result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr[-2000:]
    for part in ("error:", *says):
        assert part in lines[0], lines[0]


def _stored(tmp_path: Path) -> list[Path]:
    return [p for p in (tmp_path / "store").rglob("*") if p.is_file()]


def test_safetensors_header_nested_100000_deep_is_one_line(tmp_path: Path, llama_dir: Path) -> None:
    model = _model(tmp_path, llama_dir)
    shard = next(model.glob("*.safetensors"))
    _deep_header_shard(shard)
    result = _push(tmp_path, model)
    _assert_refused_in_one_line(result, shard.name, "safetensors header", "levels deep")
    assert _stored(tmp_path) == []


@pytest.mark.parametrize(
    ("name", "content", "says"),
    [
        ("config.json", DEEP, "levels deep"),
        ("model.safetensors.index.json", b'{"weight_map":' + DEEP + b"}", "levels deep"),
        ("tokenizer_config.json", b'{"a": 1, "a": 2}', "names 'a' twice"),
        ("config.json", b'{"vocab_size": 3' + b"0" * 5000 + b"}", "more than 40 digits"),
        ("config.json", b'{"x": 1e999}', "too large for a double"),
        ("config.json", b'{"name": "\xff\xfe"}', "not UTF-8"),
        ("config.json", b'{"hidden_size": 64, "num_', "not valid JSON"),
        ("config.json", b"[1, 2]", "not a JSON object"),
        ("model.safetensors.index.json", b'{"weight_map": [1]}', "not a valid index"),
    ],
)
def test_hostile_json_file_is_one_line(
    tmp_path: Path, llama_dir: Path, name: str, content: bytes, says: str
) -> None:
    model = _model(tmp_path, llama_dir)
    (model / name).write_bytes(content)
    result = _push(tmp_path, model)
    _assert_refused_in_one_line(result, name, says)
    assert _stored(tmp_path) == []
