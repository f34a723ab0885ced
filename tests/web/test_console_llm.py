"""An LLM function's tokens on its console page, in a real browser: a tiny model built
here (``examples.build_model``), served by a real ``thaw worker`` on the CPU, called
through ``/openai/v1`` with the ``openai`` SDK; the page draws TTFT and TPOT (cold and
warm apart) from those calls and writes the API's p50s and tokens a second."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from examples.build_model import build_model
from tests.web.conftest import CHROMIUM, Console, sign_in
from tests.web.platform import Platform
from tests.web.test_console import (
    dataset_total,
    deploy_via_api,
    open_function,
    series_total_js,
    wait_for_chart,
)

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="/usr/bin/chromium is missing; `make system-deps` installs it"
)

FUNCTION = "tiny-chat"
MODEL_REF = "tiny-chat:v1"
PROMPT = "The quick brown fox"


def _upload(platform: Platform, folder: Path, ref: str, kind: str) -> str:
    """Upload ``folder`` as the console does; its manifest digest."""
    files = sorted(p for p in folder.iterdir() if p.is_file())
    with platform.client() as c:
        r = c.post(
            "/v1/uploads",
            data={"ref": ref, "kind": kind, "paths": [f"{folder.name}/{p.name}" for p in files]},
            files=[("files", (p.name, p.read_bytes())) for p in files],
            timeout=120,
        )
    assert r.status_code == 201, r.text
    return str(r.json()["digest"])


def deploy_llm(platform: Platform, tmp: Path) -> None:
    """The tiny chat model as an LLM function: a small batch and KV cache, on the CPU."""
    _upload(platform, build_model(tmp / "model"), MODEL_REF, "model")
    (tmp / "code").mkdir()
    (tmp / "code" / "thaw.toml").write_text("")  # an LLM function's bundle holds only its spec
    bundle = _upload(platform, tmp / "code", f"bundles/{FUNCTION}:v1", "bundle")
    spec = {
        "name": FUNCTION,
        "bundle": bundle,
        "model": MODEL_REF,
        "device": "cpu",
        "timeout_s": 120,
        "llm": {"max_num_seqs": 2, "kv_cache_mb": 4, "max_tokens_limit": 64},
        "scaling": {"min_replicas": 0, "max_replicas": 1, "idle_timeout_s": 600},
    }
    with platform.client() as c:
        r = c.post("/v1/functions", json=spec, timeout=120)
    assert r.status_code == 201, r.text


def make_calls(platform: Platform) -> None:
    """A cold stream, then warm ones: two streamed completions and a chat."""
    client = openai.OpenAI(
        base_url=f"{platform.base_url}/openai/v1",
        api_key=platform.admin_key,
        max_retries=0,
        timeout=180,
    )
    for _ in range(3):
        stream = client.completions.create(
            model=FUNCTION, prompt=PROMPT, max_tokens=16, temperature=0, stream=True
        )
        assert "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
    reply = client.chat.completions.create(
        model=FUNCTION,
        messages=[{"role": "user", "content": "Hello"}],
        max_completion_tokens=16,
        temperature=0,
    )
    assert reply.usage is not None and reply.usage.completion_tokens > 0


def _tokens_js(c: Console, body: str, arg: Any) -> Any:
    """``body`` (a function of ``tokens``, the page's ``views/tokens.js``, and ``charts``)."""
    return c.page.evaluate(  # type: ignore[attr-defined]
        "async (arg) => { const tokens = await import('/web/js/views/tokens.js');"
        f" const charts = await import('/web/js/charts.js'); {body} }}",
        arg,
    )


def format_ms(c: Console, ms: float) -> str:
    """``ms`` as the page writes it."""
    return str(_tokens_js(c, "return tokens.formatTokenMs(arg);", ms))


def format_rate(c: Console, per_s: float) -> str:
    return str(_tokens_js(c, "return tokens.formatRate(arg);", per_s))


def test_token_bins_split_cold_and_warm_and_skip_calls_without_the_figure(
    console: Console,
) -> None:
    points = [
        {"cold": True, "ttft_ms": 95.0, "tpot_ms": None},
        {"cold": False, "ttft_ms": 12.0, "tpot_ms": 3.0},
        {"cold": False, "ttft_ms": 0.5, "tpot_ms": 9.5},
    ]
    ttft = _tokens_js(console, "return charts.tokenBins(arg, 'ttft_ms', 10);", points)
    assert (ttft["coldCount"], ttft["warmCount"]) == (1, 2)
    assert ttft["warm"][0] == 1 and ttft["warm"][1] == 1 and ttft["cold"][9] == 1
    tpot = _tokens_js(console, "return charts.tokenBins(arg, 'tpot_ms', 10);", points)
    assert (tpot["coldCount"], tpot["warmCount"]) == (0, 2)  # one token: no TPOT
    assert tpot["labels"][3] == "3\u20134 ms" and tpot["warm"][3] == 1 and tpot["warm"][9] == 1
    assert format_ms(console, 3.25) == "3.3 ms" and format_ms(console, 2500) == "2.50 s"
    console.assert_clean()


def test_llm_function_page_draws_ttft_and_tpot_from_real_calls(
    console: Console, platform: Platform, tmp_path: Path
) -> None:
    deploy_llm(platform, tmp_path)
    make_calls(platform)
    with platform.client() as c:
        s = c.get(f"/v1/functions/{FUNCTION}/stats/llm").json()
    assert s["calls"] == 4
    assert (s["ttft"]["cold"]["count"], s["ttft"]["warm"]["count"]) == (1, 3)
    # The cold call's first token waited for the replica to start; warm ones did not.
    assert s["ttft"]["cold"]["p50_ms"] > s["ttft"]["warm"]["p99_ms"] > 0
    with_tpot = [p for p in s["points"] if p["tpot_ms"] is not None]
    assert with_tpot, "no call made two tokens or more"
    assert s["tokens_per_s"]["overall"] > 0

    page: Any = console.page
    sign_in(console, platform.admin_key)
    open_function(console, platform, FUNCTION)
    page.get_by_role("heading", name="Tokens", exact=True).wait_for()
    ttft = wait_for_chart(console, "ttft-chart", series_total_js("warm", 3))
    assert dataset_total(ttft, "cold") == 1 and dataset_total(ttft, "warm") == 3
    cold_tpot = sum(p["cold"] for p in with_tpot)
    tpot = wait_for_chart(console, "tpot-chart", series_total_js("cold", cold_tpot))
    assert dataset_total(tpot, "warm") == len(with_tpot) - cold_tpot
    assert all(label.endswith(" ms") for label in tpot["labels"])

    figures = page.locator("#llm-stats").inner_text()
    for row in (s["ttft"]["cold"], s["ttft"]["warm"]):  # p50 / p99
        pair = f"{format_ms(console, row['p50_ms'])} / {format_ms(console, row['p99_ms'])}"
        assert pair in figures
    assert format_ms(console, s["tpot"]["warm"]["p50_ms"]) in figures
    rate = s["tokens_per_s"]
    assert f"{format_rate(console, rate['p50'])} / {format_rate(console, rate['p99'])}" in figures
    assert format_rate(console, rate["overall"]) in figures
    assert f"{s['completion_tokens']} completion tokens" in figures
    console.screenshot("function-llm-tokens")
    console.assert_clean()


def test_a_function_that_is_not_an_llm_shows_no_tokens(
    console: Console, platform: Platform
) -> None:
    deploy_via_api(platform, "plain")
    sign_in(console, platform.admin_key)
    open_function(console, platform, "plain")
    wait_for_chart(console, "latency-chart", "true")  # the page's first refresh is done
    assert console.page.locator("#tokens-title").count() == 0  # type: ignore[attr-defined]
    assert console.page.locator("#ttft-chart").count() == 0  # type: ignore[attr-defined]
    console.assert_clean()
