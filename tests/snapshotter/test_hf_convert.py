"""A transformers checkpoint in an older form pushed as its model class holds it
(``snapshotter.hf_convert``): filled with no second copy of its experts, loadable by
``from_pretrained`` as stored, and anything needing no conversion pushed as it is."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from bench.moe_fill import held_bytes
from snapshotter import load_into_module
from snapshotter.hf_convert import CONVERTED_ANNOTATION, INDEX_NAME, converted_checkpoint
from snapshotter.manifest import Manifest
from snapshotter.push import push_directory
from snapshotter.registry import Registry
from snapshotter.skeleton import empty_weights
from snapshotter.stores.local import LocalStore
from tests.snapshotter.loadkit import TEST_CHUNK_SIZE_BYTES
from tests.snapshotter.test_module_fill import mixtral, qwen2, qwen2_moe


def tensor_names(manifest: Manifest) -> set[str]:
    return {t.name for f in manifest.files if f.safetensors for t in f.safetensors.tensors}


@pytest.mark.parametrize("build", [mixtral, qwen2_moe], ids=lambda b: b.__name__)
def test_a_mixture_of_experts_is_pushed_stacked_and_filled_with_one_copy(
    tmp_path: Path, build: Any
) -> None:
    cls, inputs = build(tmp_path / "model")
    registry = Registry(LocalStore(tmp_path / "store"))
    reference = cls.from_pretrained(tmp_path / "model").eval()
    state_bytes = sum(t.numel() * t.element_size() for t in reference.state_dict().values())
    held: dict[bool, int] = {}
    for convert in (True, False):
        ref = f"m:{str(convert).lower()}"
        pushed = push_directory(
            tmp_path / "model",
            ref,
            registry,
            chunk_size_bytes=TEST_CHUNK_SIZE_BYTES,
            convert=convert,
        )
        manifest = registry.get_manifest(pushed.digest)
        with empty_weights():
            model = cls(cls.config_class.from_pretrained(tmp_path / "model"))
        names = set(model.state_dict())
        result = load_into_module(model, ref, registry=registry)
        assert result.missing_keys == () and result.unexpected_keys == ()
        with torch.no_grad():
            torch.testing.assert_close(
                model.eval()(**inputs).logits, reference(**inputs).logits, rtol=1e-5, atol=1e-6
            )
        held[convert] = held_bytes(model)
        if convert:
            assert tensor_names(manifest) <= names  # stored as the model holds them
            assert pushed.converted == manifest.annotations[CONVERTED_ANNOTATION]
            assert cls.__name__ in pushed.converted
        else:
            assert not tensor_names(manifest) <= names  # the experts apart, as saved
            assert pushed.converted is None and CONVERTED_ANNOTATION not in manifest.annotations
    # The stored form is the model's: its tensors are views of the loaded buffer, nothing
    # is made beside it. Converted at fill, the buffer stays and the stacks come on top.
    assert held[True] <= 1.02 * state_bytes
    assert held[False] >= 1.3 * state_bytes


def test_the_converted_checkpoint_loads_with_from_pretrained_in_shards(tmp_path: Path) -> None:
    cls, _ = mixtral(tmp_path / "model")
    (tmp_path / "model" / "README.md").write_text("a model card\n")
    reported: list[tuple[int, int]] = []

    conversion = converted_checkpoint(
        tmp_path / "model",
        tmp_path / "out",
        shard_bytes=16 << 10,
        progress=lambda done, total: reported.append((done, total)),
    )

    assert conversion is not None and conversion.model_class == "MixtralForCausalLM"
    out = tmp_path / "out"
    shards = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(shards) > 1 and all(s.endswith(f"-of-{len(shards):05d}.safetensors") for s in shards)
    index = json.loads((out / INDEX_NAME).read_text())
    assert sorted(set(index["weight_map"].values())) == shards
    for name in ("config.json", "generation_config.json", "README.md"):  # linked along
        assert os.path.samefile(out / name, tmp_path / "model" / name)
    assert reported and reported[-1][0] == reported[-1][1]
    assert [done for done, _ in reported] == sorted(done for done, _ in reported)

    want = cls.from_pretrained(tmp_path / "model").state_dict()
    got = cls.from_pretrained(out).state_dict()
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name
    with_experts = index["weight_map"]
    assert "model.layers.0.mlp.experts.gate_up_proj" in with_experts
    assert not any("block_sparse_moe.experts.0" in name for name in with_experts)


def test_checkpoints_needing_no_conversion_are_pushed_as_they_are(tmp_path: Path) -> None:
    qwen2(tmp_path / "qwen2")
    unknown = tmp_path / "unknown"
    mixtral(unknown)
    config = json.loads((unknown / "config.json").read_text())
    (unknown / "config.json").write_text(json.dumps({**config, "architectures": ["NoSuchModel"]}))
    registry = Registry(LocalStore(tmp_path / "store"))
    for directory in (tmp_path / "qwen2", unknown):
        assert converted_checkpoint(directory, tmp_path / "out") is None
        assert not (tmp_path / "out").exists()  # nothing written
        digests = {
            push_directory(directory, f"m:{convert}", registry, convert=convert).digest
            for convert in (True, False)
        }
        assert len(digests) == 1, directory.name


def test_a_converted_push_is_the_same_artifact_each_time(tmp_path: Path) -> None:
    """Pushing the same checkpoint again converts it to the same bytes: the same
    digest, every chunk found stored."""
    mixtral(tmp_path / "model")
    registry = Registry(LocalStore(tmp_path / "store"))
    first = push_directory(tmp_path / "model", "m:v1", registry)
    again = push_directory(tmp_path / "model", "m:v2", registry)
    assert first.converted and again.digest == first.digest
    assert again.new_bytes == 0 and again.chunks_deduplicated == again.chunks_total
