"""A synthetic Llama-shaped model in Hugging Face layout, made once and reused.

Random bf16 weights of real Llama shapes (embedding, per-layer q/k/v/o and
MLP projections, RMSNorm weights, lm_head), sharded into several
``model-0000i-of-0000n.safetensors`` files with ``model.safetensors.index.json``
and a ``config.json``. Random normal bf16 is close to incompressible, as real
trained weights are, so no loader gets a free ride from compression.

The model is complete once ``<directory>.json`` exists next to it (written
last): a crashed generation is redone, a finished one is reused. The JSON
sits outside the directory so the directory holds only what a Hugging Face
checkpoint holds.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

BF16_BYTES = 2


@dataclass(frozen=True)
class Shape:
    """The dimensions that decide a Llama's tensor shapes."""

    hidden: int
    intermediate: int
    vocab: int
    kv_dim: int  # num_key_value_heads * head_dim


# Largest first; the first whose embeddings plus one layer fit the size wins.
_SHAPES = (
    Shape(hidden=2048, intermediate=5632, vocab=32000, kv_dim=256),  # TinyLlama-1.1B
    Shape(hidden=1024, intermediate=2816, vocab=32000, kv_dim=256),
    Shape(hidden=512, intermediate=1408, vocab=8000, kv_dim=128),
    Shape(hidden=128, intermediate=352, vocab=1000, kv_dim=32),
)


def layer_tensors(shape: Shape, layer: int) -> dict[str, tuple[int, ...]]:
    p = f"model.layers.{layer}."
    h, i, kv = shape.hidden, shape.intermediate, shape.kv_dim
    return {
        p + "input_layernorm.weight": (h,),
        p + "self_attn.q_proj.weight": (h, h),
        p + "self_attn.k_proj.weight": (kv, h),
        p + "self_attn.v_proj.weight": (kv, h),
        p + "self_attn.o_proj.weight": (h, h),
        p + "post_attention_layernorm.weight": (h,),
        p + "mlp.gate_proj.weight": (i, h),
        p + "mlp.up_proj.weight": (i, h),
        p + "mlp.down_proj.weight": (h, i),
    }


def _numel(dims: tuple[int, ...]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def plan_tensors(total_bytes: int) -> tuple[Shape, dict[str, tuple[int, ...]]]:
    """Tensor names and shapes (file order) of a bf16 Llama of about ``total_bytes``.

    Pure. Picks the largest standard width whose embeddings and one layer
    fit, then the number of layers closest to the target (at least one).
    """
    for shape in _SHAPES:
        emb_bytes = 2 * shape.vocab * shape.hidden * BF16_BYTES + shape.hidden * BF16_BYTES
        layer_bytes = sum(_numel(d) for d in layer_tensors(shape, 0).values()) * BF16_BYTES
        if emb_bytes + layer_bytes <= total_bytes or shape == _SHAPES[-1]:
            break
    n_layers = max(1, round((total_bytes - emb_bytes) / layer_bytes))
    tensors: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (shape.vocab, shape.hidden)}
    for layer in range(n_layers):
        tensors.update(layer_tensors(shape, layer))
    tensors["model.norm.weight"] = (shape.hidden,)
    tensors["lm_head.weight"] = (shape.vocab, shape.hidden)
    return shape, tensors


def plan_shards(tensors: dict[str, tuple[int, ...]], n_shards: int) -> list[list[str]]:
    """Split tensor names, in order, into at most ``n_shards`` runs of similar bytes. Pure."""
    total = sum(_numel(d) for d in tensors.values()) * BF16_BYTES
    target = total / max(1, n_shards)
    shards: list[list[str]] = [[]]
    acc = 0
    for name, dims in tensors.items():
        if shards[-1] and acc >= target * len(shards) and len(shards) < n_shards:
            shards.append([])
        shards[-1].append(name)
        acc += _numel(dims) * BF16_BYTES
    return shards


@dataclass(frozen=True)
class ModelInfo:
    """What the bench needs to know about a generated model."""

    directory: str
    files: list[str]  # shard paths, absolute
    total_tensor_bytes: int
    total_file_bytes: int
    n_tensors: int
    checksum: int  # ``tensor_checksum`` of the whole state dict


def tensor_checksum(tensors: dict[str, torch.Tensor]) -> int:
    """An order-independent 64-bit checksum that reads every byte of every tensor.

    Sums each tensor's bytes as int64 words (plus the tail bytes), mixes in the
    name, and adds the per-tensor values mod 2**64. Works on any device.
    """
    acc = 0
    for name, t in tensors.items():
        u8 = t.detach().contiguous().reshape(-1).view(torch.uint8)
        n8 = u8.numel() // 8 * 8
        words = u8[:n8]
        try:
            s = int(words.view(torch.int64).sum().item())
        except RuntimeError:  # storage offset not 8-byte aligned: copy first
            s = int(words.clone().view(torch.int64).sum().item())
        s += int(u8[n8:].sum().item()) if n8 < u8.numel() else 0
        acc += (s * 1_000_003 + hash_name(name)) % (1 << 64)
    return acc % (1 << 64)


def hash_name(name: str) -> int:
    """A stable (not per-process salted) 64-bit hash of a tensor name."""
    h = 1469598103934665603
    for b in name.encode():
        h = ((h ^ b) * 1099511628211) % (1 << 64)
    return h


def _write_shards(directory: Path, tensors: dict[str, tuple[int, ...]], seed: int) -> list[Path]:
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    shards = plan_shards(tensors, n_shards=4)
    weight_map: dict[str, str] = {}
    paths = []
    for i, names in enumerate(shards, start=1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        state = {n: torch.randn(tensors[n], generator=gen).to(torch.bfloat16) for n in names}
        save_file(state, str(directory / fname), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(names, fname))
        paths.append(directory / fname)
    total = sum(_numel(d) for d in tensors.values()) * BF16_BYTES
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return paths


def _config_json(shape: Shape, n_layers: int) -> dict[str, object]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "vocab_size": shape.vocab,
        "num_hidden_layers": n_layers,
        "num_attention_heads": max(1, shape.hidden // 64),
        "num_key_value_heads": max(1, shape.kv_dim // 64),
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
    }


def checksum_files(paths: list[Path]) -> tuple[int, int]:
    """``tensor_checksum`` of every tensor in the files (summed mod 2**64), and their count."""
    from safetensors.torch import load_file

    acc = n = 0
    for p in paths:
        state = load_file(str(p))
        acc = (acc + tensor_checksum(state)) % (1 << 64)
        n += len(state)
    return acc, n


def ensure_model(data_dir: Path, size_mb: int, *, seed: int = 0) -> ModelInfo:
    """The model of ``size_mb`` MiB under ``data_dir``, generated if not already there."""
    directory = data_dir / f"llama-bf16-{size_mb}mb-seed{seed}"
    meta_path = data_dir / f"{directory.name}.json"
    if meta_path.exists():
        return ModelInfo(**json.loads(meta_path.read_text()))
    if directory.exists():
        shutil.rmtree(directory)  # an interrupted generation
    directory.mkdir(parents=True)
    shape, tensors = plan_tensors(size_mb << 20)
    paths = _write_shards(directory, tensors, seed)
    n_layers = sum(1 for n in tensors if n.endswith("input_layernorm.weight"))
    (directory / "config.json").write_text(json.dumps(_config_json(shape, n_layers), indent=2))
    checksum, n_tensors = checksum_files(paths)
    info = ModelInfo(
        directory=str(directory.resolve()),
        files=[str(p.resolve()) for p in paths],
        total_tensor_bytes=sum(_numel(d) for d in tensors.values()) * BF16_BYTES,
        total_file_bytes=sum(p.stat().st_size for p in paths),
        n_tensors=n_tensors,
        checksum=checksum,
    )
    meta_path.write_text(json.dumps(asdict(info), indent=2))
    return info
