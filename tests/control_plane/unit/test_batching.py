"""Batching in the spec and in the metrics: pure checks, no I/O."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from control_plane.protocol import CallEvent
from control_plane.services.batching import counts_batch
from control_plane.spec import FunctionSpec

BASE = {"name": "f", "bundle": "blake3:" + "0" * 64, "entry": "app:F"}


def test_a_replica_takes_a_whole_batch_or_its_target_concurrency() -> None:
    plain = FunctionSpec.model_validate({**BASE, "scaling": {"target_concurrency": 3}})
    assert plain.batching is None and plain.replica_capacity == 3
    batched = FunctionSpec.model_validate(
        {**BASE, "batching": {"max_batch_size": 16, "max_wait_ms": 5}}
    )
    assert batched.replica_capacity == 16
    wide = FunctionSpec.model_validate(
        {**BASE, "batching": {"max_batch_size": 2}, "scaling": {"target_concurrency": 8}}
    )
    assert wide.replica_capacity == 8


@pytest.mark.parametrize("batching", [{"max_batch_size": 0}, {"max_wait_ms": -1}, {"size": 2}])
def test_bad_batching_is_refused(batching: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        FunctionSpec.model_validate({**BASE, "batching": batching})


def test_a_batch_is_counted_once_from_its_first_calls_final_event() -> None:
    assert counts_batch(CallEvent(kind="succeeded", batch_size=4, batch_index=0))
    assert counts_batch(CallEvent(kind="failed", batch_size=4, batch_index=0))
    assert not counts_batch(CallEvent(kind="succeeded", batch_size=4, batch_index=1))
    assert not counts_batch(CallEvent(kind="output", batch_size=4, batch_index=0))
    assert not counts_batch(CallEvent(kind="succeeded"))  # not a batched function
