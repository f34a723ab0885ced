"""The console's pure JavaScript helpers, run in the real browser as the page loads them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.web.conftest import CHROMIUM, Console

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="/usr/bin/chromium is missing; `make system-deps` installs it"
)


def run(c: Console, body: str) -> Any:
    return c.page.evaluate(  # type: ignore[attr-defined]
        f"async () => {{ const charts = await import('/web/js/charts.js');"
        f" const api = await import('/web/js/api.js');"
        f" const deploy = await import('/web/js/views/deploy.js'); {body} }}"
    )


def call(ms: float, cold: bool, status: str = "succeeded", phases: dict | None = None) -> dict:
    return {
        "call_id": f"c{ms}{cold}",
        "status": status,
        "cold": cold,
        "accepted_at": 1000.0,
        "finished_at": 1000.0 + ms / 1000,
        "phases_ms": phases or {},
    }


def test_latency_bins_split_cold_and_warm_and_skip_failures(console: Console) -> None:
    calls = [call(10, False), call(95, False), call(100, True), call(50, True, "failed")]
    bins = run(console, f"return charts.latencyBins({json.dumps(calls)}, 10);")
    assert bins["coldCount"] == 1 and bins["warmCount"] == 2
    assert bins["labels"][0] == "0\u201310 ms" and len(bins["labels"]) == 10
    assert bins["warm"][1] == 1 and bins["warm"][9] == 1 and bins["cold"][9] == 1
    console.assert_clean()


def test_waterfall_orders_phases_and_keeps_only_cold_calls(console: Console) -> None:
    calls = [
        call(5, False),
        call(300, True, phases={"user_setup": 3, "schedule": 1, "custom": 2}),
        call(200, True, phases={"weights_fetch": 7, "schedule": 2}),
    ]
    w = run(console, f"return charts.coldWaterfall({json.dumps(calls)});")
    assert [p["phase"] for p in w["phases"]] == [
        "schedule",
        "weights_fetch",
        "user_setup",
        "custom",
    ]
    # Oldest at the top: the input is newest first.
    assert w["callIds"] == [calls[2]["call_id"], calls[1]["call_id"]]
    assert w["phases"][0]["values"] == [2, 1]
    assert w["phases"][1]["values"] == [7, 0]
    console.assert_clean()


def test_adapter_lines_and_error_details(console: Console) -> None:
    out = run(console, "return deploy.parseAdapters(' fr = llama-fr:v1 \\n\\n de=llama-de:v2');")
    assert out == [{"name": "fr", "ref": "llama-fr:v1"}, {"name": "de", "ref": "llama-de:v2"}]
    err = run(console, "try { deploy.parseAdapters('nonsense'); } catch (e) { return e.message; }")
    assert "must read name=NAME:TAG" in err
    detail = run(
        console,
        "return api.describeDetail([{loc: ['body', 'scaling', 'min_replicas'], msg: 'too big'}]);",
    )
    assert detail == "scaling.min_replicas: too big"
    console.assert_clean()
