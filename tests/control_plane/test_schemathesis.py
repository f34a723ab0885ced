"""Property-based API fuzzing: schemathesis generates requests for every operation
of the served OpenAPI document, sent with an admin key; no response may be a 5xx.

(The schemathesis pytest plugin's lazy fixtures do not work with this pytest,
so each operation's strategy is driven by Hypothesis directly.)
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from schemathesis import Case
from schemathesis.checks import not_a_server_error
from schemathesis.openapi import from_asgi

from control_plane.api.app import create_app
from control_plane.dispatch.memory import InMemoryDispatcher
from tests.control_plane.conftest import StoreFixture, make_settings

EXAMPLES_PER_OPERATION = 15


def test_no_server_errors_on_any_operation(tmp_path: Path, cp_store: StoreFixture) -> None:
    settings_ = make_settings(tmp_path, f"sqlite:///{tmp_path / 'thaw.db'}", cp_store.root)
    app = create_app(settings_, dispatcher=InMemoryDispatcher(), run_loop=False)
    auth = {"Authorization": f"Bearer {app.state.bootstrap_admin_key}"}
    schema = from_asgi("/openapi.json", app, headers=auth)
    labels: list[str] = []
    statuses: list[int] = []
    try:
        for result in schema.get_all_operations():
            operation = result.ok()
            labels.append(operation.label)

            @given(case=operation.as_strategy())
            @settings(
                max_examples=EXAMPLES_PER_OPERATION,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            def check(case: Case) -> None:
                response = case.call(headers=auth)
                statuses.append(response.status_code)
                case.validate_response(response, checks=[not_a_server_error])

            check()
    finally:
        app.state.services.db.dispose()
    # The fuzzing reached the whole surface, authenticated, not a subset.
    assert len(statuses) >= len(labels) * 5
    assert statuses.count(401) == 0, "the admin key was not applied"
    assert any(200 <= s < 300 for s in statuses)
    assert "POST /v1/functions/{name}/invoke" in labels
    assert "POST /v1/workers/{worker_id}/heartbeat" in labels
