"""Bodies refused before a call is accepted, on real stacks (issue 24): nested
300, 900 and 100000 deep (``THAW_MAX_BODY_DEPTH``), chunked past
``THAW_MAX_BODY_BYTES``, for synchronous, asynchronous and streaming calls. Each
is a named 4xx, none becomes a call, none holds a replica's slot: after eight of
them sent asynchronously, the next good call is served."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import E2EStore
from tests.faults.conftest import chaos_spec, fault_stack
from tests.faults.harness import db_value

pytestmark = pytest.mark.slow

MAX_BODY_BYTES = 300_000
MODES = {
    "sync": {},
    "async": {"Prefer": "respond-async"},
    "stream": {"Accept": "text/event-stream"},
}
JSON = {"Content-Type": "application/json"}
PATH = "/v1/functions/deep/invoke"


def nested(depth: int) -> bytes:
    """``{"input": {"x": [[...]]}}``, ``depth`` levels in all."""
    return b'{"input": {"x": ' + b"[" * (depth - 2) + b"]" * (depth - 2) + b"}}"


def chunked(body: bytes) -> Iterator[bytes]:
    for at in range(0, len(body), 64 << 10):
        yield body[at : at + (64 << 10)]


@pytest.mark.parametrize("backend", ["embedded", "postgres-redis"])
def test_deep_and_oversize_bodies_are_named_4xx_and_hold_no_slot(
    tmp_path: Path, chaos_store: E2EStore, backend: str
) -> None:
    env = {"THAW_MAX_BODY_BYTES": str(MAX_BODY_BYTES)}
    with fault_stack(backend, tmp_path, chaos_store, **env) as stack:
        scaling = {"min_replicas": 2, "max_replicas": 2, "idle_timeout_s": 120}
        stack.deploy(chaos_spec(chaos_store, "deep", scaling=scaling))
        with stack.client() as c:
            assert c.post(PATH, json={"input": {"x": 1}}).status_code == 200  # both warm
            for mode, headers in MODES.items():
                for depth in (300, 900, 100_000):
                    r = c.post(PATH, content=nested(depth), headers={**headers, **JSON})
                    assert r.status_code == 400, (mode, depth, r.text)
                    assert "(THAW_MAX_BODY_DEPTH)" in r.json()["detail"]
                oversize = chunked(b'{"input": "' + b"z" * MAX_BODY_BYTES + b'"}')
                r = c.post(PATH, content=oversize, headers={**headers, **JSON})
                assert r.status_code == 413, (mode, r.text)
                assert "(THAW_MAX_BODY_BYTES)" in r.json()["detail"]
            for _ in range(8):  # as many as filled both replicas before
                r = c.post(PATH, content=nested(300), headers={**MODES["async"], **JSON})
                assert r.status_code == 400
            r = c.post(PATH, json={"input": {"x": 2}})
            assert r.status_code == 200 and r.json()["status"] == "succeeded", r.text
        assert db_value(stack, "SELECT count(*) FROM calls") == 2
