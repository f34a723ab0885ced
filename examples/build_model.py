"""Build the example's model locally: a tiny Llama, its tokenizer, two LoRA adapters.

Nothing is downloaded. The tokenizer is a byte-level BPE trained here on a
few sentences; the model has random weights (its text is gibberish, made
of real tokens), saved in the Hugging Face layout with safetensors shards::

    python examples/build_model.py OUT_DIR
    OUT_DIR/model/                 config.json, *.safetensors, tokenizer.json, ...
    OUT_DIR/adapters/pirate/       adapter_config.json, adapter_model.safetensors
    OUT_DIR/adapters/poet/

Push them with ``thaw models push`` (``thaw up`` does all of this).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A cold start is the first request after a function scaled to zero.",
    "Weights stream from the store into GPU memory in chunks.",
    "thaw runs Python functions on your own machines.",
    "Every millisecond of a cold start has a name.",
    "Hello, world! How are you today?",
]
SPECIAL_TOKENS = ["<s>", "</s>", "<unk>"]
ADAPTERS = {"pirate": 1, "poet": 2}  # name -> seed
# A plain chat template (Jinja, as transformers renders it): one line per message,
# then the assistant's turn. Saved as chat_template.jinja beside the tokenizer.
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant:{% endif %}"
)


def build_tokenizer(vocab_size: int = 320) -> object:
    """A byte-level BPE tokenizer trained on ``SENTENCES``, as a transformers tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(SENTENCES, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_model(
    path: Path,
    *,
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    max_shard_size: str = "100KB",
) -> Path:
    """The Llama (tiny by default) and its tokenizer files, in ``path``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_tokenizer()
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),  # type: ignore[arg-type]
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,  # type: ignore[attr-defined]
        eos_token_id=tokenizer.eos_token_id,  # type: ignore[attr-defined]
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(path, max_shard_size=max_shard_size)
    tokenizer.save_pretrained(path)  # type: ignore[attr-defined]
    return path


def build_adapter(base_dir: Path, path: Path, *, seed: int, r: int = 8) -> Path:
    """A LoRA adapter of the model in ``base_dir`` whose B matrices are not zero."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    base = LlamaForCausalLM.from_pretrained(base_dir)
    cfg = LoraConfig(r=r, lora_alpha=2 * r, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    model = get_peft_model(base, cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)  # large enough to change what the model says
    model.save_pretrained(str(path))
    return path


def build_all(
    out: Path,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    adapter_r: int = 8,
    max_shard_size: str = "100KB",
) -> dict[str, Path]:
    """Model and adapters under ``out``; returns name -> directory ("model", adapters).

    The defaults build the tiny example; ``bench/coldstart.py`` asks for a bigger one.
    """
    model_dir = build_model(
        out / "model", hidden_size=hidden_size, num_layers=num_layers, max_shard_size=max_shard_size
    )
    dirs = {"model": model_dir}
    for name, seed in ADAPTERS.items():
        dirs[name] = build_adapter(model_dir, out / "adapters" / name, seed=seed, r=adapter_r)
    return dirs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="directory to write model/ and adapters/ into")
    args = parser.parse_args()
    for name, path in build_all(args.out).items():
        print(f"{name}\t{path}")


if __name__ == "__main__":
    main()
