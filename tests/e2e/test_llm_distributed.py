"""An LLM function on the distributed stack: PostgreSQL, Redis as the broker (the
worker agent consumes through Celery), an S3 server (moto) as the store. From zero,
``thaw loadtest`` streams through a cold start; its figures agree with the server's
metrics, and a call's record, headers and trace-facing timings are those the
embedded stack gives."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import openai
import pytest

from examples.build_model import build_model
from snapshotter.config import S3Config
from snapshotter.stores.s3 import S3Store
from tests.e2e.conftest import E2EStore, running_stack
from tests.e2e.llm_stack import (
    FUNCTION,
    check_loadtest,
    llm_metrics,
    llm_spec,
    push_llm,
    run_loadtest,
)
from tests.e2e.stack import Stack
from tests.fixtures.s3 import create_bucket, moto_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("llm-distributed")
    model_dir = build_model(tmp / "model")
    with moto_server() as endpoint:
        bucket = f"llm-{uuid.uuid4().hex[:8]}"
        create_bucket(endpoint, bucket)
        s3 = {
            "THAW_STORE": f"s3://{bucket}/store",
            "THAW_S3_ENDPOINT_URL": endpoint,
            "THAW_S3_ACCESS_KEY_ID": "test",
            "THAW_S3_SECRET_ACCESS_KEY": "test",
        }
        config = S3Config(endpoint, "us-east-1", "test", "test")
        bundle = push_llm(S3Store(s3["THAW_STORE"], config), model_dir, tmp)
        # E2EStore.root is unused here: THAW_STORE from settings names the bucket
        store = E2EStore(root=tmp / "unused", bundle=bundle, model="tiny-chat:v1")
        with running_stack("postgres-redis", tmp, store, settings=s3) as s:
            s.deploy(llm_spec(bundle))
            yield s


def test_loadtest_through_a_cold_start_agrees_with_the_server(stack: Stack) -> None:
    before = llm_metrics(stack)
    doc = run_loadtest(
        stack,
        FUNCTION,
        "--concurrency", "3", "--duration-s", "8", "--max-tokens", "12",
        "--endpoint", "completions", "--slo-ttft-ms", "120000", "--slo-tpot-ms", "120000",
    )  # fmt: skip
    check_loadtest(doc, before, llm_metrics(stack))
    assert doc["cold"]["calls"] >= 1, doc["cold"]  # the first ones waited for the replica
    # However long that start took, the replica is warm now: a second run is warm.
    before = llm_metrics(stack)
    warm = run_loadtest(
        stack, FUNCTION, "--concurrency", "2", "--duration-s", "2", "--max-tokens", "12",
        "--endpoint", "completions",
    )  # fmt: skip
    check_loadtest(warm, before, llm_metrics(stack))
    assert warm["warm"]["calls"] >= 1 and warm["cold"]["calls"] == 0, warm["cold"]
    assert doc["cold"]["ttft_ms"]["p50"] > warm["warm"]["ttft_ms"]["p50"]
    # SLOs no call can miss on a slow machine: every call that succeeded is good, the
    # ones that waited for the start included.
    assert doc["goodput"]["share"] == 1.0


def test_a_call_has_its_token_figures_in_record_and_headers(stack: Stack) -> None:
    client = openai.OpenAI(
        base_url=f"{stack.url}/openai/v1", api_key=stack.admin_key, max_retries=0
    )
    raw = client.chat.completions.with_raw_response.create(
        model=f"{FUNCTION}:pirate",
        messages=[{"role": "user", "content": "Hello from the distributed stack"}],
        max_tokens=10,
        temperature=0,
    )
    reply = raw.parse()
    assert reply.usage is not None and reply.usage.completion_tokens > 0
    timing = raw.headers["server-timing"]
    for name in ("ttft", "tpot", "engine_queue"):
        assert f"{name};dur=" in timing, timing
    call = stack.call(raw.headers["x-thaw-call-id"])
    assert call["cold"] is False and call["status"] == "succeeded"
    assert 0 <= call["timings_ms"]["engine_queue"] <= call["timings_ms"]["ttft"]
