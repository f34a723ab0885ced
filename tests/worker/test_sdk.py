"""The SDK's contract helpers: how a function is called and what counts as a stream."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import worker.sdk as sdk
from tests.fixtures.models import build_bert_classifier
from worker.sdk import Context, accepts_call_context, is_stream


class OneArg:
    def __call__(self, input: Any) -> Any:
        return input


class TwoArgs:
    def __call__(self, input: Any, call: Any) -> Any:
        return input


class OptionalCall:
    def __call__(self, input: Any, call: Any = None) -> Any:
        return input


class VarArgs:
    def __call__(self, *args: Any) -> Any:
        return args


class KeywordOnly:
    def __call__(self, input: Any, *, call: Any = None) -> Any:
        return input


@pytest.mark.parametrize(
    ("fn", "expected"),
    [(OneArg(), False), (TwoArgs(), True), (OptionalCall(), True), (VarArgs(), True)],
)
def test_call_context_is_passed_when_a_second_positional_is_taken(fn: Any, expected: bool) -> None:
    assert accepts_call_context(fn) is expected


def test_keyword_only_call_is_not_positional() -> None:
    assert accepts_call_context(KeywordOnly()) is False


def gen() -> Iterator[int]:
    yield 1


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (gen(), True),
        (iter([1, 2]), True),
        ({"a": 1}, False),
        ([1, 2], False),
        ("text", False),
        (None, False),
    ],
)
def test_only_generators_and_iterators_stream(value: Any, expected: bool) -> None:
    assert is_stream(value) is expected


@pytest.mark.parametrize(
    ("reported", "expected"),
    [
        ({"prompt_tokens": 12, "completion_tokens": 30}, (12, 30)),
        ({"prompt_tokens": 0, "completion_tokens": 0, "cached": 4}, (0, 0)),  # "cached": dropped
        ({}, None),  # counted nothing
        ({"prompt_tokens": 12}, None),  # half a count is none
        ({"prompt_tokens": 12, "completion_tokens": -1}, None),
        ({"prompt_tokens": 12, "completion_tokens": 3.0}, None),
        ({"prompt_tokens": 12, "completion_tokens": "30"}, None),
        ({"prompt_tokens": True, "completion_tokens": 30}, None),
        ({"prompt_tokens": 12, "completion_tokens": sdk.MAX_TOKEN_COUNT + 1}, None),
    ],
)
def test_a_functions_usage_is_both_counts_well_formed_or_none(
    reported: dict[Any, Any], expected: tuple[int, int] | None
) -> None:
    usage = sdk.function_usage(reported)
    counts = None if usage is None else (usage.prompt_tokens, usage.completion_tokens)
    assert counts == expected


@pytest.mark.parametrize(
    ("reported", "expected"),
    [
        ([1.25, 0, 3], [1.25, 0.0, 3.0]),
        ([0.1234567], [0.123]),  # microseconds
        ([], None),
        ("1.0", None),
        ([1.0, -2.0], None),  # a partial list would skew the histogram
        ([1.0, True], None),
        ([1.0, float("nan")], None),
    ],
)
def test_a_functions_token_gaps_are_all_well_formed_or_none(
    reported: Any, expected: list[float] | None
) -> None:
    assert sdk.function_token_gaps(reported) == expected


def test_token_gaps_past_the_cap_keep_the_first() -> None:
    gaps = sdk.function_token_gaps([1.0] * (sdk.MAX_TOKEN_GAPS + 5))
    assert gaps is not None and len(gaps) == sdk.MAX_TOKEN_GAPS


def test_fill_module_adopts_weights_without_copy() -> None:
    weights = {"weight": torch.randn(3, 2), "bias": torch.randn(3)}
    with torch.device("meta"):
        module = torch.nn.Linear(2, 3)
    from snapshotter.loader import LoadedTensors

    tensors = LoadedTensors(weights)
    tensors.report = None  # type: ignore[assignment]
    ctx = Context(device="cpu", weights=tensors)
    ctx.fill_module(module)
    assert module.weight.data_ptr() == weights["weight"].data_ptr()
    assert torch.equal(
        module(torch.ones(1, 2)), torch.ones(1, 2) @ weights["weight"].T + weights["bias"]
    )


def test_readme_pattern_fills_a_bert_with_its_position_ids(tmp_path: Path) -> None:
    from safetensors.torch import load_file
    from transformers import BertConfig, BertForSequenceClassification

    from snapshotter.loader import LoadedTensors

    build_bert_classifier(tmp_path)
    tensors = LoadedTensors(load_file(tmp_path / "model.safetensors"))
    tensors.report = None  # type: ignore[assignment]
    ctx = Context(
        device="cpu", weights=tensors, config=json.loads((tmp_path / "config.json").read_text())
    )
    with ctx.empty_weights():
        model = BertForSequenceClassification(BertConfig.from_dict(ctx.config))
    result = ctx.fill_module(model)
    assert set(result.recomputed_buffers) == {
        "bert.embeddings.position_ids",
        "bert.embeddings.token_type_ids",
    }
    reference = BertForSequenceClassification.from_pretrained(tmp_path).eval()
    ids = torch.tensor([[2, 7, 9, 3]])
    with torch.no_grad():
        assert torch.equal(model.eval()(ids).logits, reference(ids).logits)


def test_public_surface_is_pinned() -> None:
    assert sorted(sdk.__all__) == [
        "Adapter",
        "CallContext",
        "Context",
        "Function",
        "ReplicaLost",
        "accepts_call_context",
        "is_stream",
    ]
