"""The endpoints the web console reads and drives, served for real with a fake worker:
stats, recent calls, workers, catalog, scaling edits, warm-up, uploads, static files."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.control_plane.conftest import GOOD_CODE, ControlPlane


def _wait(predicate, timeout_s: float = 10.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def test_stats_split_cold_and_warm_and_recent_calls_carry_phases(cp: ControlPlane) -> None:
    cp.worker(start_delay_s=0.2)
    cp.deploy("echo")
    with cp.client() as c:
        assert c.get("/v1/functions/echo/stats").json()["status"] == "scaled-to-zero"
        for i in range(3):
            assert c.post("/v1/functions/echo/invoke", json={"input": i}).status_code == 200
        r = c.post("/v1/functions/echo/invoke", json={"input": {"fail": "boom"}})
        assert r.status_code == 500
        stats = c.get("/v1/functions/echo/stats").json()
        assert stats["status"] == "serving" and stats["replicas"] == {"ready": 1}
        assert stats["calls"] == 4 and stats["calls_failed"] == 1
        assert stats["cold"]["count"] == 1 and stats["warm"]["count"] == 2
        assert stats["cold_start_rate"] == pytest.approx(0.25)
        # The cold call waited for the 0.2 s start; warm ones did not.
        assert stats["cold"]["p50_ms"] >= 200 > stats["warm"]["p95_ms"]
        assert [s["name"] for s in c.get("/v1/stats/functions").json()] == ["echo"]
        calls = c.get("/v1/functions/echo/calls", params={"limit": 10}).json()
        assert len(calls) == 4 and calls[0]["status"] == "failed"
        cold = [x for x in calls if x["cold"]]
        assert len(cold) == 1 and cold[0]["phases_ms"]["weights_fetch"] == 200
        assert c.get("/v1/functions/nope/stats").status_code == 404


def test_workers_list_devices_cache_and_replicas(cp: ControlPlane) -> None:
    model_digest = _digest(cp, cp.store.model_ref)
    worker = cp.worker(cached_manifests=[model_digest])
    cp.deploy("echo")
    with cp.client() as c:
        assert c.post("/v1/functions/echo/invoke", json={"input": 1}).status_code == 200
        rows = c.get("/v1/workers").json()
        assert [w["id"] for w in rows] == [worker.id]
        w = rows[0]
        assert w["devices"][0]["kind"] == "cpu" and w["memory_bytes"] == 1 << 30
        disk = w["cache"][0]
        assert disk["tier"] == "disk"
        assert disk["artifacts"] == [{"digest": model_digest, "refs": [cp.store.model_ref]}]
        assert [(r["function"], r["state"]) for r in w["replicas"]] == [("echo", "ready")]
    with cp.client(cp.key("deploy")) as c:
        assert c.get("/v1/workers").status_code == 403


def _digest(cp: ControlPlane, ref: str) -> str:
    with cp.client() as c:
        return str(c.get(f"/v1/models/{ref}").json()["digest"])


def test_catalog_reports_sharing_and_users(cp: ControlPlane) -> None:
    cp.deploy("echo", adapters=[{"name": "a0", "ref": cp.store.adapter_refs[0]}])
    with cp.client() as c:
        rows = {f"{a['name']}:{a['tag']}": a for a in c.get("/v1/catalog").json()}
    model = rows[cp.store.model_ref]
    assert model["used_by"] == ["echo"] and model["kind"] == "model"
    assert model["raw_size_bytes"] > 0 and model["stored_size_bytes"] > 0
    assert rows[cp.store.adapter_refs[0]]["used_by"] == ["echo"]
    assert rows[cp.store.adapter_refs[1]]["used_by"] == []
    assert all(0 <= a["shared_stored_bytes"] <= a["stored_size_bytes"] for a in rows.values())


def test_scaling_edit_in_place_and_validated(cp: ControlPlane) -> None:
    cp.worker()
    cp.deploy("echo")
    body = {"min_replicas": 1, "max_replicas": 3, "idle_timeout_s": 30, "target_concurrency": 2}
    with cp.client() as c:
        r = c.patch("/v1/functions/echo/scaling", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["version"] == 1 and r.json()["versions"] == [1]
        assert r.json()["spec"]["scaling"] == {**body, "idle_timeout_s": 30.0}
        # min_replicas=1 makes the reconciler start a replica with no traffic.
        _wait(lambda: c.get("/v1/functions/echo/stats").json()["replicas"].get("ready"))
        bad = c.patch("/v1/functions/echo/scaling", json={**body, "min_replicas": 5})
        assert bad.status_code == 422 and "exceeds max_replicas" in bad.text
        assert c.patch("/v1/functions/nope/scaling", json=body).status_code == 404


def test_warm_starts_one_replica_that_survives_idle_reconciles(cp: ControlPlane) -> None:
    cp.worker()
    cp.deploy("echo")
    with cp.client() as c:
        r = c.post("/v1/functions/echo/warm")
        assert r.status_code == 202 and r.json()["started_replica_id"]
        _wait(lambda: c.get("/v1/functions/echo/stats").json()["status"] == "serving")
        again = c.post("/v1/functions/echo/warm").json()
        assert again["started_replica_id"] is None and again["live_replicas"] == 1
        time.sleep(0.5)  # ten reconcile passes with no calls at all
        assert c.get("/v1/functions/echo/stats").json()["replicas"] == {"ready": 1}
        first = c.post("/v1/functions/echo/invoke", json={"input": 1})
        assert first.headers["X-Thaw-Cold"] == "false"


def test_warm_without_workers_says_why(cp: ControlPlane) -> None:
    cp.deploy("echo")
    with cp.client() as c:
        r = c.post("/v1/functions/echo/warm")
        assert r.status_code == 503 and r.json()["detail"]


def _files(root: Path, prefix: str) -> tuple[list[str], list[tuple[str, tuple[str, bytes]]]]:
    paths, files = [], []
    for p in sorted(root.rglob("*")):
        if p.is_file():
            paths.append(f"{prefix}/{p.relative_to(root).as_posix()}")
            files.append(("files", (p.name, p.read_bytes())))
    return paths, files


def test_upload_model_folder_dedups_against_the_store(cp: ControlPlane, llama_dir: Path) -> None:
    paths, files = _files(llama_dir, "llama")
    with cp.client() as c:
        r = c.post("/v1/uploads", data={"ref": "copy:v1", "paths": paths}, files=files)
        assert r.status_code == 201, r.text
        body = r.json()
        # The same bytes as the fixture's llama-tiny:v1: same digest, nothing new stored.
        assert body["digest"] == _digest(cp, cp.store.model_ref)
        assert body["kind"] == "model" and body["new_bytes"] == 0
        assert body["dedup_bytes"] == body["raw_size_bytes"] > 0
        assert c.get("/v1/models/copy:v1").status_code == 200


def test_upload_bundle_returns_its_spec_then_deploys(cp: ControlPlane, tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(GOOD_CODE)
    (tmp_path / "thaw.toml").write_text(
        'name = "up"\nentry = "app:Echo"\n[scaling]\nmax_replicas = 2\n'
    )
    paths, files = _files(tmp_path, "code")
    with cp.client() as c:
        r = c.post(
            "/v1/uploads",
            data={"ref": "bundles/up:v1", "kind": "bundle", "paths": paths},
            files=files,
        )
        assert r.status_code == 201, r.text
        spec = r.json()["spec"]
        assert spec == {"name": "up", "entry": "app:Echo", "scaling": {"max_replicas": 2}}
        spec["bundle"] = r.json()["digest"]
        assert c.post("/v1/functions", json=spec).status_code == 201


def test_uploads_have_their_own_body_limit(cp_factory: Any) -> None:
    cp = cp_factory(max_body_bytes=1000, max_upload_bytes=50_000)
    with cp.client() as c:
        big = {"ref": "x:v1", "kind": "bundle", "paths": "blob.txt"}
        ok = c.post("/v1/uploads", data=big, files=[("files", ("blob.txt", b"x" * 20_000))])
        assert ok.status_code == 201, ok.text
        over = c.post("/v1/uploads", data=big, files=[("files", ("blob.txt", b"x" * 60_000))])
        assert over.status_code == 413 and "THAW_MAX_UPLOAD_BYTES" in over.json()["detail"]
        # Every other route keeps the small limit.
        r = c.post("/v1/keys", json={"scopes": ["invoke"], "name": "n" * 2000})
        assert r.status_code == 413 and "THAW_MAX_BODY_BYTES" in r.json()["detail"]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"ref": "x:v1", "paths": "../evil"}, "not a plain relative path"),
        ({"ref": "x:v1"}, "0 paths for 1 files"),
        ({"paths": "a.txt"}, "needs a ref field"),
        ({"ref": "x:v1", "kind": "layer", "paths": "a.txt"}, "kind must be one of"),
        ({"ref": "x:v1", "kind": "model", "paths": "a.txt"}, "cannot be pushed: the folder holds"),
    ],
)
def test_bad_uploads_are_400_saying_why(
    cp: ControlPlane, fields: dict[str, str], message: str
) -> None:
    with cp.client() as c:
        r = c.post("/v1/uploads", data=fields, files=[("files", ("a.txt", b"hi"))])
    assert r.status_code == 400 and message in r.json()["detail"], r.text


def test_console_files_are_served_without_a_key(cp: ControlPlane) -> None:
    with httpx.Client(base_url=cp.base_url) as c:
        index = c.get("/")
        assert index.status_code == 200 and "<title>thaw" in index.text
        js = c.get("/web/js/app.js")
        assert js.status_code == 200 and "javascript" in js.headers["content-type"]
        assert c.get("/web/../pyproject.toml").status_code == 404
        assert c.get("/web/%2e%2e/pyproject.toml").status_code == 404
        assert c.get("/web/nope.js").status_code == 404
        assert c.get("/v1/functions").status_code == 401
