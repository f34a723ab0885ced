"""What a completion's text costs the replica: the decode stream against the whole decode.

    python bench/detokenize.py [--tokens 256,1024,4096] [--trials 5] [--model DIR]

Detokenizes one completion of random ids, a token at a time, as a replica hands each
step to its caller (``worker.llm.detokenize``), two ways in one run, interleaved:
``stream``, the fast tokenizer's ``DecodeStream`` primed with the prompt's tail (what
the replica does), and ``whole``, the whole completion decoded again at each token
(what it did before, and still does for a tokenizer with no fast backend). Prints the
median milliseconds per completion, the microseconds for one token at its end, and
the ratio. The tokenizer is the example model's byte-level BPE, or ``--model``'s.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from worker.llm.detokenize import IncrementalDetokenizer

PROMPT_IDS = 32


class WholeDecode:
    """The tokenizer seen as one with no fast backend: ``IncrementalDetokenizer``
    then decodes the whole completion at each token."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return str(self._tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens))


def tokenizer_of(model: Path | None) -> Any:
    if model is None:
        from examples.build_model import build_tokenizer

        return build_tokenizer()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model)


def one_completion(tokenizer: Any, prompt: list[int], ids: list[int]) -> tuple[float, float, str]:
    """Seconds for the whole completion, seconds for its last token, and its text."""
    detok = IncrementalDetokenizer(tokenizer, prompt_ids=prompt)
    text, last_s = [], 0.0
    t0 = time.perf_counter()
    for token_id in ids:
        t = time.perf_counter()
        text.append(detok.add([token_id]))
        last_s = time.perf_counter() - t
    text.append(detok.finish())
    return time.perf_counter() - t0, last_s, "".join(text)


def measure(tokenizer: Any, tokens: int, trials: int, seed: int = 0) -> dict[str, Any]:
    """Both ways on the same ids, alternated ``trials`` times: medians and the ratio.
    Raises if the two texts differ past the first token (the stream keeps the
    prompt's context, the whole decode has none)."""
    draw = random.Random(seed)
    special = set(tokenizer.all_special_ids)
    vocab = [i for i in range(len(tokenizer)) if i not in special]
    prompt = [draw.choice(vocab) for _ in range(PROMPT_IDS)]
    ids = [draw.choice(vocab) for _ in range(tokens)]
    ways = {"stream": tokenizer, "whole": WholeDecode(tokenizer)}
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in ways}
    texts: dict[str, str] = {}
    for _ in range(trials):
        for name, tok in ways.items():
            total_s, last_s, texts[name] = one_completion(tok, prompt, ids)
            runs[name].append((total_s, last_s))
    whole = tokenizer.decode(ids, skip_special_tokens=True)
    if texts["whole"] != whole or not texts["stream"].endswith(whole[1:]):
        raise RuntimeError("the decode stream's text is not the completion's")
    row: dict[str, Any] = {"tokens": tokens}
    for name, values in runs.items():
        row[f"{name}_ms"] = statistics.median(v[0] for v in values) * 1000
        row[f"{name}_last_us"] = statistics.median(v[1] for v in values) * 1e6
    row["ratio"] = row["whole_ms"] / row["stream_ms"]
    return row


def table(rows: list[dict[str, Any]]) -> str:
    head = "| tokens | stream ms | whole ms | whole / stream | last token, stream µs | whole µs |"
    lines = [head, "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(
            f"| {r['tokens']} | {r['stream_ms']:.1f} | {r['whole_ms']:.1f} | {r['ratio']:.0f}x "
            f"| {r['stream_last_us']:.1f} | {r['whole_last_us']:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/detokenize.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", default="256,1024,4096", help="completion lengths, comma-separated")
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--model", type=Path, default=None, help="a model directory's tokenizer")
    a = p.parse_args(argv)
    tokenizer = tokenizer_of(a.model)
    rows = []
    for n in (int(t) for t in a.tokens.split(",")):
        print(f"detokenizing {n} tokens, {a.trials} trials each way ...", file=sys.stderr)
        rows.append(measure(tokenizer, n, a.trials))
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
