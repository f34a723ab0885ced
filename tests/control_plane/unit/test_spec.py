"""The thaw.toml format documented in control_plane.spec parses as documented,
and thaw.yaml with the same keys gives the same spec."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

import control_plane.spec as spec_module
from cli.functions import read_spec_file
from control_plane.spec import LLM_ENTRY, FunctionSpec

DIGEST = "blake3:" + "0" * 64


def _documented_example() -> str:
    doc = spec_module.__doc__ or ""
    block = doc.split("::\n\n", 1)[1].split("\n\n``thaw deploy", 1)[0]
    return "\n".join(line[4:] for line in block.splitlines())


def test_documented_example_is_a_valid_spec() -> None:
    spec = FunctionSpec.model_validate({**tomllib.loads(_documented_example()), "bundle": DIGEST})
    assert spec.adapters[0].name == "fr" and spec.scaling.target_concurrency == 4
    assert spec.env == {"MY_FLAG": "1"}


def test_documented_llm_example_is_a_valid_spec() -> None:
    doc = spec_module.__doc__ or ""
    block = doc.split("writes this for you::\n\n", 1)[1]
    toml = "\n".join(line[4:] for line in block.splitlines())
    spec = FunctionSpec.model_validate({**tomllib.loads(toml), "bundle": DIGEST})
    assert spec.llm is not None and spec.llm.kv_cache_mb == 64
    assert spec.entry == LLM_ENTRY
    assert spec.scaling.target_concurrency == spec.llm.max_num_seqs == 8


def test_yaml_and_toml_give_the_same_spec(tmp_path: Path) -> None:
    doc = tomllib.loads(_documented_example())
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "thaw.toml").write_text(_documented_example())
    (tmp_path / "y").mkdir()
    (tmp_path / "y" / "thaw.yaml").write_text(yaml.safe_dump(doc))
    assert read_spec_file(tmp_path / "t") == read_spec_file(tmp_path / "y") == doc


def test_bad_specs_name_the_field() -> None:
    with pytest.raises(ValidationError, match="min_replicas"):
        FunctionSpec.model_validate(
            {"name": "a", "bundle": DIGEST, "entry": "m:C", "scaling": {"min_replicas": 2}}
        )
    with pytest.raises(ValidationError, match="unique"):
        adapters = [{"name": "x", "ref": "a:v1"}, {"name": "x", "ref": "b:v1"}]
        FunctionSpec.model_validate(
            {"name": "a", "bundle": DIGEST, "entry": "m:C", "adapters": adapters}
        )


def test_an_llm_spec_is_refused_with_what_to_change() -> None:
    llm = {"name": "chat", "bundle": DIGEST, "llm": {}}
    for extra, message in [
        ({}, "set model"),
        ({"model": "m:v1", "entry": "app:C"}, "leave entry out"),
        ({"model": "m:v1", "batching": {"max_batch_size": 4}}, "remove \\[batching\\]"),
        ({"model": "m:v1", "llm": {"kv_cache_mb": 0}}, "kv_cache_mb"),
        ({"model": "m:v1", "llm": {"page_size": 8}}, "page_size"),
    ]:
        with pytest.raises(ValidationError, match=message):
            FunctionSpec.model_validate({**llm, **extra})
    with pytest.raises(ValidationError, match="add one"):
        FunctionSpec.model_validate({"name": "a", "bundle": DIGEST, "entry": LLM_ENTRY})
    scaled = {**llm, "model": "m:v1", "scaling": {"target_concurrency": 2}}
    assert FunctionSpec.model_validate(scaled).scaling.target_concurrency == 2
