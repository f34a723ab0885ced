"""The core path with Celery on RabbitMQ (and PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.conftest import E2EStore, running_stack
from tests.e2e.stack import Stack
from tests.e2e.test_platform import check_async_idempotency, check_cold_then_warm, check_stream

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, e2e_store: E2EStore) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("e2e-rabbitmq")
    with running_stack("postgres-rabbitmq", tmp, e2e_store) as s:
        yield s


def test_deploy_cold_warm_stream_async_on_rabbitmq(stack: Stack, e2e_store: E2EStore) -> None:
    check_cold_then_warm(stack, e2e_store)
    check_stream(stack, e2e_store)
    check_async_idempotency(stack)
