"""A function that describes what setup received, to test the worker's loading."""

from __future__ import annotations

from typing import Any


class Inspect:
    def setup(self, ctx: Any) -> None:
        self.report = {
            "device": ctx.device,
            "weights": {k: [str(v.device), list(v.shape)] for k, v in ctx.weights.items()},
            "config_model_type": ctx.config.get("model_type"),
            "files": sorted(p.name for p in ctx.files.iterdir()) if ctx.files else None,
            "adapters": {
                name: {"r": a.config.get("r"), "tensors": len(a.tensors)}
                for name, a in ctx.adapters.items()
            },
        }
        self.weights = ctx.weights

    def __call__(self, input: Any) -> Any:
        if input == "sum":
            return float(self.weights[input_name(self.weights)].double().sum())
        return self.report


def input_name(weights: dict[str, Any]) -> str:
    return sorted(weights)[0]
