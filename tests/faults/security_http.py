"""HTTP helpers for the security tests: calls against a served control plane, its ledger."""

from __future__ import annotations

import httpx
import sqlalchemy as sa

from control_plane.db.models import Call
from control_plane.protocol import TASK_START_REPLICA
from tests.control_plane.conftest import ControlPlane
from tests.control_plane.fake_worker import FakeWorker


def starts(worker: FakeWorker, function: str) -> int:
    return sum(
        1 for task, p in worker.received if task == TASK_START_REPLICA and p["function"] == function
    )


def invoke(cp: ControlPlane, name: str, token: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    with httpx.Client(base_url=cp.base_url, headers=headers, timeout=30) as c:
        return c.post(f"/v1/functions/{name}/invoke", json={"input": {"x": 1}})


def recorded_calls(cp: ControlPlane, function: str) -> int:
    engine = sa.create_engine(cp.settings.database_url_resolved())
    try:
        with engine.connect() as conn:
            query = sa.select(sa.func.count()).where(Call.function == function)
            return int(conn.execute(query).scalar_one())
    finally:
        engine.dispose()


def key(cp: ControlPlane, **body: object) -> str:
    with cp.client() as c:
        r = c.post("/v1/keys", json=body)
        assert r.status_code == 201, r.text
        return str(r.json()["token"])


def database_holds(cp: ControlPlane, needle: str) -> list[str]:
    """Tables of the control plane's database with a row whose text contains ``needle``."""
    engine = sa.create_engine(cp.settings.database_url_resolved())
    found = []
    try:
        meta = sa.MetaData()
        meta.reflect(engine)
        with engine.connect() as conn:
            for table in meta.sorted_tables:
                if any(needle in str(tuple(row)) for row in conn.execute(sa.select(table))):
                    found.append(table.name)
    finally:
        engine.dispose()
    return found
