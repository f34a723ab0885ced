"""``GET /v1/functions/{name}/stats/llm`` on the served app (SQLite and PostgreSQL),
from calls a fake worker ends with an LLM replica's token counts and timings."""

from __future__ import annotations

import pytest

from tests.control_plane.conftest import ControlPlane

# What an LLM replica times (``worker.llm.function``): 8 ms prefill after 2 ms in the
# engine's queue, then 4 ms a token; 6 tokens take 28 ms of generation.
TIMINGS_MS = {"engine_queue": 2.0, "ttft": 10.0, "tpot": 4.0, "itl_p50": 4.0, "itl_p99": 5.0}
LLM_INPUT = {"tokens": [5, 6], "timings_ms": TIMINGS_MS}


def test_ttft_tpot_and_tokens_a_second_of_stored_calls(cp: ControlPlane) -> None:
    cp.worker(start_delay_s=0.3)
    cp.deploy("chat")
    with cp.client() as c:
        for _ in range(3):
            r = c.post("/v1/functions/chat/invoke", json={"input": LLM_INPUT})
            assert r.status_code == 200, r.text
        # Neither a call that counted no tokens nor a failed one is an LLM figure.
        assert c.post("/v1/functions/chat/invoke", json={"input": 1}).status_code == 200
        failed = {**LLM_INPUT, "fail": "boom"}
        assert c.post("/v1/functions/chat/invoke", json={"input": failed}).status_code == 500
        r = c.get("/v1/functions/chat/stats/llm")
        assert r.status_code == 200, r.text
        s = r.json()
        calls = c.get("/v1/functions/chat/calls").json()

    assert s["name"] == "chat" and s["calls"] == 3
    assert (s["prompt_tokens"], s["completion_tokens"]) == (15, 18)
    assert (s["ttft"]["cold"]["count"], s["ttft"]["warm"]["count"]) == (1, 2)
    # The TTFT seen: the call's wait for a replica (the 0.3 s start when cold) + ttft.
    assert s["ttft"]["cold"]["p50_ms"] >= 300 + 10 > s["ttft"]["warm"]["p99_ms"] >= 10
    assert s["tpot"]["cold"]["p50_ms"] == s["tpot"]["warm"]["p99_ms"] == 4.0
    assert s["tokens_per_s"]["p50"] == pytest.approx(6 / 0.028)
    assert s["tokens_per_s"]["overall"] == pytest.approx(6 / 0.028)
    points = s["points"]
    assert [p["cold"] for p in points] == [False, False, True]  # newest first
    by_time = {x["accepted_at"]: x for x in calls}
    for p in points:  # each point is a stored call, its TTFT as its record gives it
        timings = by_time[p["accepted_at"]]["timings_ms"]
        assert p["ttft_ms"] == pytest.approx(timings["queue_wait"] + timings["ttft"])
        assert (p["completion_tokens"], p["generation_ms"]) == (6, 28.0)


def test_a_function_without_llm_calls_has_no_figures_and_unknown_is_404(
    cp: ControlPlane,
) -> None:
    cp.worker()
    cp.deploy("echo")
    with cp.client() as c:
        assert c.post("/v1/functions/echo/invoke", json={"input": 1}).status_code == 200
        s = c.get("/v1/functions/echo/stats/llm").json()
        assert s["calls"] == 0 and s["points"] == []
        assert s["ttft"]["warm"]["p50_ms"] is None and s["tokens_per_s"]["overall"] is None
        assert c.get("/v1/functions/nope/stats/llm").status_code == 404
        assert c.get("/v1/functions/echo/stats/llm", params={"limit": 0}).status_code == 422
    with cp.client(cp.key("invoke")) as c:
        assert c.get("/v1/functions/echo/stats/llm").status_code == 403
