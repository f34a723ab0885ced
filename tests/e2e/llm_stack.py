"""An LLM function (``[llm]``, no code) on a running stack: the example's tiny Llama
(random weights, its byte-level tokenizer and chat template) and a LoRA, pushed to
the stack's store, deployed as ``chat`` scaled to zero."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
from typer.testing import CliRunner, Result

from cli.main import app
from examples.build_model import build_adapter
from snapshotter.manifest import ArtifactKind
from snapshotter.push import push_directory
from snapshotter.registry import Registry
from snapshotter.stores import Store
from tests.e2e.stack import Stack

FUNCTION = "chat"
MAX_NUM_SEQS = 8


def push_llm(store: Store, model_dir: Path, tmp: Path) -> str:
    """Push the model, the ``pirate`` adapter and an LLM bundle; the bundle's digest."""
    registry = Registry(store)
    push_directory(model_dir, "tiny-chat:v1", registry)
    adapter = build_adapter(model_dir, tmp / "pirate", seed=1)
    push_directory(adapter, "tiny-pirate:v1", registry)
    code = tmp / "code"
    code.mkdir()
    (code / "thaw.toml").write_text("")  # an LLM function's bundle holds only its spec
    return push_directory(code, "bundles/chat:v1", registry, kind=ArtifactKind.BUNDLE).digest


def llm_spec(bundle: str) -> dict[str, Any]:
    return {
        "name": FUNCTION,
        "bundle": bundle,
        "model": "tiny-chat:v1",
        "device": "cpu",
        "timeout_s": 120,
        "adapters": [{"name": "pirate", "ref": "tiny-pirate:v1"}],
        "llm": {"max_num_seqs": MAX_NUM_SEQS, "kv_cache_mb": 4, "max_tokens_limit": 200},
        "scaling": {"min_replicas": 0, "max_replicas": 1, "idle_timeout_s": 600},
    }


def llm_metrics(stack: Stack) -> dict[str, float]:
    """``/metrics`` as {series: value} for the LLM function's token-level series."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(
        f"{stack.url}/metrics", headers={"Authorization": f"Bearer {stack.admin_key}"}
    ).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("thaw_llm_") and s.labels.get("function") == FUNCTION:
                labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "le")
                if "le" not in s.labels:
                    out[f"{s.name}{{{labels}}}"] = s.value
    return out


def loadtest_cli(stack: Stack, *args: str) -> Result:
    env = {"THAW_SERVER_URL": stack.url, "THAW_API_KEY": stack.admin_key}
    return CliRunner().invoke(app, ["loadtest", *args], env=env)


def run_loadtest(stack: Stack, *args: str) -> dict[str, Any]:
    """``thaw loadtest ... --json`` on the stack, as a user runs it; its summary."""
    result = loadtest_cli(stack, *args, "--json")
    assert result.exit_code == 0, result.output
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


def check_loadtest(doc: dict[str, Any], before: dict[str, float], after: dict[str, float]) -> None:
    """What ``thaw loadtest`` saw of an LLM function is what the server counted."""

    def grew(series: str) -> float:
        return after.get(series, 0.0) - before.get(series, 0.0)

    fn = f"function={FUNCTION}"
    assert doc["llm"] and doc["errors"] == 0, doc["error_examples"]
    assert doc["calls"] == doc["ok"] > 0
    assert doc["warm"]["calls"] + doc["cold"]["calls"] == doc["calls"]  # each one known
    for cold in ("true", "false"):
        key = "cold" if cold == "true" else "warm"
        count = f"thaw_llm_time_to_first_token_seconds_count{{cold={cold},{fn}}}"
        assert grew(count) == doc[key]["calls"], (cold, doc[key])
    assert doc["completion_tokens"] == grew(f"thaw_llm_generation_tokens_total{{{fn}}}") > 0
    assert doc["prompt_tokens"] == grew(f"thaw_llm_prompt_tokens_total{{{fn}}}") > 0
    assert doc["output_tokens_per_s"] > 0
    for key in ("ttft_ms", "tpot_ms"):
        q = doc[key]
        assert 0 < q["p50"] <= q["p90"] <= q["p95"] <= q["p99"] <= q["max"], (key, q)
