"""`thaw models` through typer's CliRunner, on a local store and on S3 (moto server)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from cli.progress import human_bytes
from snapshotter.config import StoreConfig
from snapshotter.registry import Registry, chunk_key
from snapshotter.stores import open_store


@pytest.fixture
def env(store_config: StoreConfig, tmp_path: Path) -> dict[str, str]:
    """Settings as a user would give them: THAW_STORE and THAW_S3_* in the environment."""
    s3 = store_config.s3
    values = {
        "THAW_HOME": str(tmp_path / "home"),
        "THAW_STORE": store_config.url,
        "THAW_S3_ENDPOINT_URL": s3.endpoint_url or "",
        "THAW_S3_ACCESS_KEY_ID": s3.access_key_id or "",
        "THAW_S3_SECRET_ACCESS_KEY": s3.secret_access_key or "",
        "COLUMNS": "200",
    }
    return {k: v for k, v in values.items() if v}


def thaw(env: dict[str, str], *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args), env=env)
    return result.exit_code, result.output


def test_push_ls_pull_verify(
    env: dict[str, str], store_config: StoreConfig, llama_dir: Path, tmp_path: Path
) -> None:
    code, output = thaw(env, "models", "push", str(llama_dir), "llama-tiny:v1")
    assert code == 0, output
    registry = Registry(open_store(store_config))
    digest = registry.resolve("llama-tiny:v1")
    manifest = registry.get_manifest(digest)
    assert f"digest  {digest}" in output
    assert f"raw {human_bytes(manifest.raw_size)}" in output
    assert f"new {human_bytes(manifest.stored_size)}" in output
    assert "deduplicated 0 B" in output

    code, output = thaw(env, "models", "push", str(llama_dir), "llama-tiny:v2")
    assert code == 0, output
    assert "new 0 B" in output and f"deduplicated {human_bytes(manifest.raw_size)}" in output

    code, output = thaw(env, "models", "ls")
    assert code == 0, output
    short = digest.split(":")[1][:12]
    for ref in ("llama-tiny:v1", "llama-tiny:v2"):
        assert ref in output
    assert "model" in output and short in output and human_bytes(manifest.raw_size) in output

    out = tmp_path / "pulled"
    code, output = thaw(env, "models", "pull", "llama-tiny:v1", str(out))
    assert code == 0, output
    for f in manifest.files:
        assert (out / f.path).read_bytes() == (llama_dir / f.path).read_bytes()

    code, output = thaw(env, "models", "verify", "llama-tiny:v1")
    assert code == 0, output
    assert "ok" in output


def test_verify_exits_1_naming_the_corrupt_chunk(
    env: dict[str, str], store_config: StoreConfig, adapter_dirs: list[Path]
) -> None:
    code, output = thaw(env, "models", "push", str(adapter_dirs[0]), "lora:v1")
    assert code == 0, output
    assert "(adapter)" in output
    registry = Registry(open_store(store_config))
    chunk = registry.get_manifest(registry.resolve("lora:v1")).files[-1].chunks[-1]
    data = bytearray(registry.store.get(chunk_key(chunk.digest)))
    data[-1] ^= 0x01
    registry.store.put(chunk_key(chunk.digest), bytes(data))

    code, output = thaw(env, "models", "verify", "lora:v1")
    assert code == 1, output
    assert f"bad chunk {chunk.digest}" in output and "1 bad" in output


def test_snapshotter_errors_are_one_red_line_and_exit_2(
    env: dict[str, str], tmp_path: Path
) -> None:
    bad = tmp_path / "pickled"
    bad.mkdir()
    (bad / "pytorch_model.bin").write_bytes(b"\x80\x04not opened")
    code, output = thaw(env, "models", "push", str(bad), "bad:v1")
    assert code == 2
    [line] = output.strip().splitlines()  # one line: no bar, no traceback
    assert line.startswith("error: ") and "pytorch_model.bin" in line and "safetensors" in line

    code, output = thaw(env, "models", "pull", "missing:v1", str(tmp_path / "x"))
    assert code == 2
    [line] = output.strip().splitlines()
    assert line.startswith("error: missing:v1 is not in store")

    code, output = thaw(env, "models", "verify", "Not A Ref")
    assert (code, "Traceback" in output) == (2, False)
    assert "invalid artifact name" in output


def test_store_option_overrides_settings_and_bundle_kind(tmp_path: Path) -> None:
    src = tmp_path / "code"
    src.mkdir()
    (src / "app.py").write_text("print('hi')\n")
    store = tmp_path / "other-store"
    env = {"THAW_HOME": str(tmp_path / "home"), "COLUMNS": "200"}
    code, output = thaw(
        env, "models", "push", str(src), "fn:1", "--kind", "bundle", "--store", str(store)
    )
    assert code == 0, output
    assert "(bundle)" in output
    assert [t.ref for t in Registry(open_store(StoreConfig(str(store)))).tags()] == ["fn:1"]
    code, output = thaw(env, "models", "ls")
    assert code == 0 and "no artifacts in" in output
    code, output = thaw(env, "models", "ls", "--store", str(store))
    assert "fn:1" in output and "bundle" in output


def test_a_mixture_of_experts_is_converted_as_it_is_pushed(tmp_path: Path) -> None:
    """The push says the checkpoint was converted, and to what; ``--no-convert`` keeps
    it as saved."""
    from tests.snapshotter.test_module_fill import mixtral

    mixtral(tmp_path / "moe")
    store = tmp_path / "store"
    env = {"THAW_HOME": str(tmp_path / "home"), "THAW_STORE": str(store), "COLUMNS": "200"}
    code, output = thaw(env, "models", "push", str(tmp_path / "moe"), "moe:v1")
    assert code == 0, output
    assert "convert" in output  # the conversion's bar
    [line] = [x for x in output.splitlines() if x.startswith("converted  ")]
    assert "tensors of MixtralForCausalLM converted by transformers" in line
    registry = Registry(open_store(StoreConfig(str(store))))
    code, output = thaw(env, "models", "push", str(tmp_path / "moe"), "moe:v2", "--no-convert")
    assert code == 0, output
    assert "converted  " not in output
    assert registry.resolve("moe:v2") != registry.resolve("moe:v1")


def test_human_bytes() -> None:
    assert human_bytes(0) == "0 B"
    assert human_bytes(1023) == "1023 B"
    assert human_bytes(1536) == "1.5 KiB"
    assert human_bytes(5 << 30) == "5.0 GiB"
