"""A mixture of experts pushed as saved against pushed converted: what the filled model
holds, and what the push and the fill take.

    python bench/moe_fill.py [--hidden 512] [--experts 8] [--layers 4] [--trials 3]

Builds a Mixtral of the given size (random weights, saved by ``save_pretrained``: each
expert's matrices apart), pushes it to a local store twice, as saved
(``convert=False``) and converted (``snapshotter.hf_convert``), and fills a skeleton from
each on the CPU. "held" is the memory the filled model keeps alive, each storage its
tensors view counted once, over the model's own state; the times are medians of the
trials (each push to a fresh store).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from rich.console import Console
from rich.table import Table


def held_bytes(model: torch.nn.Module) -> int:
    """The memory a filled model keeps alive: each storage its tensors view, once."""
    storages = {}
    for tensor in [*model.parameters(), *model.buffers()]:
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--trials", type=int, default=3)
    args = p.parse_args(argv)
    from transformers import MixtralConfig, MixtralForCausalLM

    from snapshotter import load_into_module
    from snapshotter.push import push_directory
    from snapshotter.registry import Registry
    from snapshotter.skeleton import empty_weights
    from snapshotter.stores.local import LocalStore

    config = MixtralConfig(
        vocab_size=1024,
        hidden_size=args.hidden,
        intermediate_size=2 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=8,
        num_key_value_heads=4,
        num_local_experts=args.experts,
        num_experts_per_tok=2,
    )
    rows = []
    with tempfile.TemporaryDirectory(prefix="thaw-bench-moe-") as tmp:
        model_dir = Path(tmp) / "model"
        MixtralForCausalLM(config).save_pretrained(model_dir)
        state = sum(
            t.numel() * t.element_size() for t in MixtralForCausalLM(config).state_dict().values()
        )
        for convert in (False, True):
            push_s, fill_s, held = [], [], 0
            for trial in range(args.trials):
                registry = Registry(LocalStore(Path(tmp) / f"store-{convert}-{trial}"))
                began = time.perf_counter()
                push_directory(model_dir, "moe:v1", registry, convert=convert)
                push_s.append(time.perf_counter() - began)
                with empty_weights():
                    model = MixtralForCausalLM(config)
                began = time.perf_counter()
                load_into_module(model, "moe:v1", registry=registry)
                fill_s.append(time.perf_counter() - began)
                held = held_bytes(model)
                del model
            rows.append((convert, held, statistics.median(push_s), statistics.median(fill_s)))
    table = Table(
        "push",
        "held MB",
        "held / state",
        "push s",
        "fill s",
        title=f"Mixtral, {args.experts} experts x {args.layers} layers, "
        f"hidden {args.hidden}: state {state / 1e6:.1f} MB, medians of {args.trials}",
    )
    for convert, held, push, fill in rows:
        table.add_row(
            "converted" if convert else "as saved",
            f"{held / 1e6:.1f}",
            f"{held / state:.2f}",
            f"{push:.2f}",
            f"{fill:.3f}",
        )
    Console().print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
