"""Filling a model skeleton gives the model ``from_pretrained`` gives, for architectures
with non-persistent buffers (BERT's position and token type ids, rotary ``inv_freq``,
CLIP's position ids), and fails naming anything left on the meta device."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
import torch

from snapshotter import load_into_module
from snapshotter.module_fill import StateDictMismatchError, UnfilledTensorsError
from snapshotter.registry import Registry
from snapshotter.skeleton import empty_weights
from snapshotter.stores.local import LocalStore
from tests.fixtures.models import build_bert_classifier
from tests.snapshotter.loadkit import push

IDS = torch.tensor([[2, 7, 9, 12, 30, 3]])


def bert(path: Path) -> tuple[Any, dict[str, Any]]:
    from transformers import BertForSequenceClassification

    build_bert_classifier(path)
    return BertForSequenceClassification, {"input_ids": IDS}


def qwen2(path: Path) -> tuple[Any, dict[str, Any]]:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    Qwen2ForCausalLM(config).save_pretrained(path)
    return Qwen2ForCausalLM, {"input_ids": IDS}


def clip(path: Path) -> tuple[Any, dict[str, Any]]:
    from transformers import CLIPConfig, CLIPModel

    small = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4}
    config = CLIPConfig(
        text_config={**small, "vocab_size": 64, "num_hidden_layers": 1},
        vision_config={**small, "num_hidden_layers": 1, "image_size": 32, "patch_size": 8},
        projection_dim=16,
    )
    CLIPModel(config).save_pretrained(path)
    pixels = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    return CLIPModel, {"input_ids": IDS, "pixel_values": pixels}


def mixtral(path: Path) -> tuple[Any, dict[str, Any]]:
    """Saved as transformers 5 saves it: each expert's w1, w2, w3 apart, under
    ``block_sparse_moe``; the model holds them stacked, under ``mlp.experts``."""
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=64,
    )
    MixtralForCausalLM(config).save_pretrained(path)
    return MixtralForCausalLM, {"input_ids": IDS}


def qwen2_moe(path: Path) -> tuple[Any, dict[str, Any]]:
    """Experts apart in the checkpoint (gate_proj, up_proj, down_proj), a shared
    expert beside them."""
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    config = Qwen2MoeConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=64,
    )
    Qwen2MoeForCausalLM(config).save_pretrained(path)
    return Qwen2MoeForCausalLM, {"input_ids": IDS}


def gpt_neox(path: Path) -> tuple[Any, dict[str, Any]]:
    """The output layer is ``embed_out`` in the checkpoint, ``lm_head`` in the model."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    config = GPTNeoXConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
    )
    GPTNeoXForCausalLM(config).save_pretrained(path)
    return GPTNeoXForCausalLM, {"input_ids": IDS}


SKELETONS: dict[str, Callable[[], AbstractContextManager[Any]]] = {
    "empty_weights": empty_weights,
    "meta": lambda: torch.device("meta"),
}


@pytest.mark.parametrize("convert", [True, False], ids=["converted-at-push", "as-saved"])
@pytest.mark.parametrize("skeleton", sorted(SKELETONS))
@pytest.mark.parametrize(
    "build", [bert, qwen2, clip, mixtral, qwen2_moe, gpt_neox], ids=lambda b: b.__name__
)
def test_filled_skeleton_answers_as_from_pretrained(
    tmp_path: Path,
    build: Callable[[Path], tuple[Any, dict[str, Any]]],
    skeleton: str,
    convert: bool,
) -> None:
    """Pushed as the model class holds it, or as saved (an older form converted at fill)."""
    cls, inputs = build(tmp_path / "model")
    registry = Registry(LocalStore(tmp_path / "store"))
    push(registry, tmp_path / "model", "m:v1", convert=convert)
    with SKELETONS[skeleton]():
        model = cls(cls.config_class.from_pretrained(tmp_path / "model"))
    non_persistent = {n for n, _ in model.named_buffers()} - set(model.state_dict())
    assert non_persistent  # the point of the test: buffers no checkpoint holds

    result = load_into_module(model, "m:v1", registry=registry)

    assert result.missing_keys == () and result.unexpected_keys == ()
    reference = cls.from_pretrained(tmp_path / "model")
    for name, tensor in reference.state_dict().items():  # converted as from_pretrained does
        assert torch.equal(model.state_dict()[name], tensor), name
    assert non_persistent <= set(result.recomputed_buffers)
    assert not any(t.is_meta for t in [*model.parameters(), *model.buffers()])
    for name, buffer in reference.named_buffers():
        assert torch.equal(model.get_buffer(name), buffer), name
    with torch.no_grad():
        got, want = model.eval()(**inputs), reference.eval()(**inputs)
    for key in ("logits", "logits_per_image"):
        if key in want:
            # Not always bitwise: a tensor the loader hands over at an offset that is
            # not 64-byte aligned can take another kernel path (last-bit differences).
            torch.testing.assert_close(got[key], want[key], rtol=1e-5, atol=1e-6)


def test_empty_weights_makes_parameters_meta_and_buffers_real() -> None:
    from transformers import BertConfig, BertModel

    config = BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4)
    with torch.device("meta"), empty_weights():  # buffers are real even inside meta
        model = BertModel(config)
    assert all(p.is_meta for p in model.parameters())
    assert all(p.requires_grad for p in model.parameters())
    ids = model.embeddings.position_ids
    assert ids.device.type == "cpu" and torch.equal(ids[0], torch.arange(ids.shape[1]))
    assert torch.nn.Linear(2, 3).weight.device.type == "cpu"  # the hook is gone


class Rotary(torch.nn.Module):
    """A module with a non-persistent buffer and no config: it cannot be rebuilt."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)
        self.register_buffer("inv_freq", torch.arange(4.0), persistent=False)


def test_a_buffer_left_on_meta_fails_naming_it(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    (tmp_path / "m").mkdir()
    save_file(
        {k: v.contiguous() for k, v in Rotary().state_dict().items()},
        tmp_path / "m" / "model.safetensors",
    )
    registry = Registry(LocalStore(tmp_path / "store"))
    push(registry, tmp_path / "m", "rotary:v1")
    with torch.device("meta"):
        model = Rotary()
    for strict in (True, False):
        with pytest.raises(UnfilledTensorsError, match=r"\['inv_freq'\]") as info:
            load_into_module(model, "rotary:v1", registry=registry, strict=strict)
        assert "empty_weights()" in str(info.value) and "strict=False" not in str(info.value)

    with empty_weights():
        model = Rotary()
    result = load_into_module(model, "rotary:v1", registry=registry)
    assert result.recomputed_buffers == ("inv_freq",)
    assert torch.equal(model.get_buffer("inv_freq"), torch.arange(4.0))


def test_parameters_the_checkpoint_lacks_fail_even_without_strict(
    tmp_path: Path, llama_dir: Path
) -> None:
    from transformers import AutoConfig, LlamaForCausalLM

    registry = Registry(LocalStore(tmp_path / "store"))
    push(registry, llama_dir, "llama:v1")
    config = AutoConfig.from_pretrained(llama_dir)
    config.num_hidden_layers = 3  # the checkpoint has 2 layers
    for strict in (True, False):
        with empty_weights():
            model = LlamaForCausalLM(config)
        with pytest.raises(UnfilledTensorsError, match=r"\['model.layers.2\.") as info:
            load_into_module(model, "llama:v1", registry=registry, strict=strict)
        assert "does not match the checkpoint" in str(info.value)
        assert "strict=False" not in str(info.value)


def test_tensors_the_module_lacks_are_unexpected(tmp_path: Path, llama_dir: Path) -> None:
    from transformers import AutoConfig, LlamaForCausalLM

    registry = Registry(LocalStore(tmp_path / "store"))
    push(registry, llama_dir, "llama:v1")
    config = AutoConfig.from_pretrained(llama_dir)
    config.num_hidden_layers = 1  # the checkpoint has 2 layers
    with empty_weights():
        model = LlamaForCausalLM(config)
    with pytest.raises(StateDictMismatchError, match=r"unexpected \['model.layers.1\."):
        load_into_module(model, "llama:v1", registry=registry)
    with empty_weights():
        model = LlamaForCausalLM(config)
    result = load_into_module(model, "llama:v1", registry=registry, strict=False)
    assert result.missing_keys == ()
    assert result.unexpected_keys and all(
        k.startswith("model.layers.1.") for k in result.unexpected_keys
    )


def test_a_checkpoint_in_the_models_names_is_filled_as_it_is_and_an_older_one_converted(
    tmp_path: Path,
) -> None:
    """Tensors named as the model's become its parameters with no copy; in a converted
    checkpoint those no conversion touches do too, and only the experts are new."""
    from safetensors.torch import load_file

    from snapshotter.hf_names import model_named
    from snapshotter.load_types import LoadedTensors

    cls, _ = mixtral(tmp_path / "model")
    config = cls.config_class.from_pretrained(tmp_path / "model")
    with empty_weights():
        model = cls(config)
    expected = model.state_dict(keep_vars=True)
    stored = load_file(tmp_path / "model" / "model.safetensors")
    assert not set(stored) <= set(expected)  # per-expert names the model does not have
    named = model_named(model, stored, expected)
    assert set(named) == set(expected)
    assert named["lm_head.weight"] is stored["lm_head.weight"]  # untouched: no copy
    assert named["model.layers.1.mlp.experts.down_proj"].shape[0] == config.num_local_experts
    mine = {name: named[name] for name in expected}
    assert model_named(model, mine, expected) is mine  # already the model's: no lookup
    loaded = LoadedTensors(stored)
    loaded.report = None  # type: ignore[assignment]
    from snapshotter.module_fill import fill_module

    fill_module(model, loaded, torch.device("cpu"))
    assert model.lm_head.weight.data_ptr() == stored["lm_head.weight"].data_ptr()


def test_a_converted_models_first_forward_is_recorded_in_the_checkpoints_names(
    tmp_path: Path,
) -> None:
    """The prefetch profile names the manifest's tensors: a stack of experts is
    recorded as the experts it was made of, a renamed tensor as its stored name."""
    from safetensors import safe_open

    from snapshotter.profile import ModuleAccessRecorder

    for build, stacked in ((mixtral, "mlp.experts.gate_up_proj"), (gpt_neox, "lm_head.weight")):
        path = tmp_path / build.__name__
        cls, inputs = build(path)
        registry = Registry(LocalStore(tmp_path / "store"))
        push(registry, path, f"{build.__name__}:v1", convert=False)  # converted at fill
        with empty_weights():
            model = cls(cls.config_class.from_pretrained(path))
        load_into_module(model, f"{build.__name__}:v1", registry=registry)
        with ModuleAccessRecorder(model) as recorder, torch.no_grad():
            model.eval()(**inputs)
        with safe_open(path / "model.safetensors", "pt") as f:
            stored = set(f.keys())
        buffers = {name for name, _ in model.named_buffers()}  # in no checkpoint
        assert recorder.order and set(recorder.order) - buffers <= stored  # the manifest's
        assert not any(name.endswith(stacked) for name in recorder.order)
        if build is mixtral:
            assert "model.layers.0.block_sparse_moe.experts.3.w2.weight" in recorder.order
        else:
            assert recorder.order[-1] == "embed_out.weight"  # the last layer, as stored
