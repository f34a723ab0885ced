"""Batched test functions: ``batch(inputs)`` gets a list, returns one value per input."""

from __future__ import annotations

from typing import Any


class Doubler:
    """Doubles each ``x``; every answer says how big its batch was; ``fail`` fails one call."""

    def batch(self, inputs: list[Any], calls: list[Any]) -> list[Any]:
        return [
            ValueError(f"asked to fail: {x['x']}")
            if x.get("fail")
            else {"y": 2 * x["x"], "seen": len(inputs), "call_id": c.call_id}
            for x, c in zip(inputs, calls, strict=True)
        ]


class Tokens:
    """Streams ``n`` tokens per call, one step for the whole batch at a time."""

    def batch(self, inputs: list[Any]) -> Any:
        longest = max(int(x["n"]) for x in inputs)
        for step in range(longest):
            yield [f"t{step}" if step < int(x["n"]) else None for x in inputs]


class TokensThenTotals:
    """Streams a token per step; a negative ``n`` fails that call alone; returns totals."""

    def batch(self, inputs: list[Any]) -> Any:
        yield [ValueError("n must not be negative") if x["n"] < 0 else None for x in inputs]
        for step in range(max(x["n"] for x in inputs)):
            yield [f"t{step}" if step < x["n"] else None for x in inputs]
        return [{"tokens": x["n"]} for x in inputs]


class WrongLength:
    def batch(self, inputs: list[Any]) -> list[Any]:
        return inputs[:-1]


class NoBatchMethod:
    def __call__(self, input: Any) -> Any:
        return input
