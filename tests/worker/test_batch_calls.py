"""BatchRunner with the replica's real adapter cache: a batch naming an adapter that
the function does not list loads it once for the batch, and every answer says what
the replica holds afterwards (the router prefers holders)."""

from __future__ import annotations

import contextlib
import io
import sys
from typing import Any

import pytest

from control_plane.protocol import TokenUsage
from worker.adapters import AdapterCache
from worker.batch_calls import BatchRunner
from worker.child_protocol import FROM_CHILD, CallError, CallMsg, Result
from worker.log_guard import MARKER, GuardedStream
from worker.sdk import Adapter


class Upper:
    def batch(self, inputs: list[str]) -> list[str]:
        return [s.upper() for s in inputs]


class Replica:
    instance = Upper()


def _runner(cache: AdapterCache, sent: list[Any]) -> BatchRunner:
    def use(name: str | None) -> Any:
        return cache.use(name) if name is not None else contextlib.nullcontext(None)

    def loaded(name: str | None) -> list[str] | None:
        return cache.loaded() if name is not None else None

    return BatchRunner(Replica(), lambda m: sent.append(FROM_CHILD.validate_python(m)), use, loaded)


def test_a_batch_reports_the_adapters_the_replica_holds_after_it() -> None:
    fetched: list[str] = []

    def fetch(ref: str) -> Adapter:
        fetched.append(ref)
        return Adapter(ref, {}, {})

    cache = AdapterCache({"listed": Adapter("listed", {}, {})}, fetch, cap=1)
    sent: list[Any] = []
    runner = _runner(cache, sent)
    runner.run([CallMsg(call_id=f"c{i}", input="x", adapter="new:v1") for i in range(3)], [0.0] * 3)
    runner.run([CallMsg(call_id="plain", input="y")], [0.0])
    runner.run([CallMsg(call_id="other", input="z", adapter="other:v1")], [0.0])
    results = {m.call_id: m for m in sent if isinstance(m, Result)}
    assert fetched == ["new:v1", "other:v1"]  # once for the whole batch
    assert [results[f"c{i}"].output for i in range(3)] == ["X", "X", "X"]
    assert {tuple(results[f"c{i}"].loaded_adapters or []) for i in range(3)} == {
        ("listed", "new:v1")
    }
    assert results["plain"].loaded_adapters is None  # no adapter named: nothing changed
    # The cap of 1 on-demand adapter evicted new:v1 once other:v1 was released.
    assert results["other"].loaded_adapters == ["listed", "other:v1"]


class Chatty:
    def batch(self, inputs: list[str]) -> list[str]:
        for s in inputs:
            print(f"working on {s}")
        return inputs


class ChattyReplica:
    instance = Chatty()


def test_each_batch_gets_its_own_print_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", GuardedStream(out, {}, max_bytes=40))
    sent: list[Any] = []
    runner = BatchRunner(ChattyReplica(), sent.append, lambda _: contextlib.nullcontext(None))
    runner.run([CallMsg(call_id=f"a{i}", input=f"a{i}") for i in range(3)], [0.0] * 3)
    runner.run([CallMsg(call_id="b", input="b")], [0.0])
    # 3 x 14 bytes pass 40: the first batch's third line is dropped and marked once; the
    # second batch, on the same thread, prints again.
    assert out.getvalue() == (
        "working on a0\nworking on a1\n" + MARKER.format(cap=40) + "working on b\n"
    )


class Counting:
    """Counts each call's words as its prompt and completion tokens; a ``bad`` input
    counts a malformed completion, an ``error`` one fails only its own call."""

    def batch(self, inputs: list[str], calls: list[Any]) -> list[Any]:
        for text, call in zip(inputs, calls, strict=True):
            n = len(text.split())
            call.usage.update(prompt_tokens=n, completion_tokens=-1 if text == "bad" else n)
        return [ValueError("asked to") if text == "error" else text for text in inputs]


class CountingReplica:
    instance = Counting()


def test_each_call_of_a_batch_reports_its_own_usage() -> None:
    sent: list[Any] = []
    runner = BatchRunner(
        CountingReplica(),
        lambda m: sent.append(FROM_CHILD.validate_python(m)),
        lambda _: contextlib.nullcontext(None),
    )
    inputs = ["a b", "c d e", "bad", "error"]
    runner.run([CallMsg(call_id=s, input=s) for s in inputs], [0.0] * 4)
    answers = {m.call_id: m for m in sent}
    assert answers["a b"].usage == TokenUsage(prompt_tokens=2, completion_tokens=2)
    assert answers["c d e"].usage == TokenUsage(prompt_tokens=3, completion_tokens=3)
    assert answers["bad"].usage is None  # malformed: dropped
    assert isinstance(answers["error"], CallError)  # failed, yet its tokens were used
    assert answers["error"].usage == TokenUsage(prompt_tokens=1, completion_tokens=1)
