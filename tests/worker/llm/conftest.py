"""The engine tests' shared fixtures: the tiny random Llama and an engine over it,
one of each per test module (a module may define its own engine with other sizes)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.worker.llm.test_engine import EOS, tiny_llama
from worker.llm.engine import Engine, EngineSizes


@pytest.fixture(scope="module")
def model() -> Any:
    return tiny_llama()


@pytest.fixture(scope="module")
def engine(model: Any) -> Iterator[Engine]:
    sizes = EngineSizes(max_num_seqs=8, max_batch_tokens=256, kv_cache_bytes=4 << 20)
    e = Engine(model, sizes, eos_token_ids=[EOS])
    yield e
    e.close()
