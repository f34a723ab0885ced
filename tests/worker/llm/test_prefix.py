"""Prompt-prefix KV reuse in the engine (``worker.llm.prefix``): a request's id carries
its adapter load's salt, and a request that ends at its first token still leaves its
prompt's blocks for the next (transformers skipped them)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from tests.worker.llm.test_engine import EOS, VOCAB, generate_alone
from worker.llm.engine import Engine, EngineSizes, Sampling
from worker.llm.prefix import request_salt, salted_request_id


@pytest.fixture(scope="module")
def engine(model: Any) -> Iterator[Engine]:
    sizes = EngineSizes(max_num_seqs=4, max_batch_tokens=256, kv_cache_bytes=4 << 20)
    engine = Engine(model, sizes, eos_token_ids=[EOS])
    yield engine
    engine.close()


def tokens(engine: Engine, prompt: list[int], n: int) -> list[int]:
    return [t for s in engine.generate(prompt, Sampling(max_new_tokens=n)) for t in s.token_ids]


def test_a_request_that_ends_at_its_first_token_leaves_its_prompt_cached(
    engine: Engine, model: Any
) -> None:
    prompt = torch.randint(3, VOCAB, (150,), generator=torch.Generator().manual_seed(5)).tolist()
    first = tokens(engine, prompt, 1)  # a one-token answer: it ends in its prefill's step
    hits = engine.prefix_hit_tokens
    assert tokens(engine, prompt, 1) == first == generate_alone(model, prompt, 1)
    assert engine.prefix_hit_tokens - hits == 128  # its two full blocks, found cached
    # Found cached, the prompt's blocks give the same longer answer as computed anew.
    assert tokens(engine, prompt, 8) == generate_alone(model, prompt, 8)


def test_a_request_id_carries_its_adapters_salt() -> None:
    assert request_salt(salted_request_id(2**64 - 1)) == 2**64 - 1
    assert request_salt(salted_request_id(None)) is None
    assert request_salt("thaw-probe-" + "a" * 32) is None and request_salt("r1@zz") is None
    assert salted_request_id(5) != salted_request_id(5)
