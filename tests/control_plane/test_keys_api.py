"""API keys over HTTP: bootstrap admin, scopes, function limits, revocation, 401/403."""

from __future__ import annotations

import httpx

from tests.control_plane.conftest import ControlPlane


def test_healthz_needs_no_key(cp: ControlPlane) -> None:
    assert httpx.get(cp.base_url + "/healthz").json() == {"status": "ok"}


def test_missing_malformed_and_wrong_keys_are_401(cp: ControlPlane) -> None:
    assert httpx.get(cp.base_url + "/v1/functions").status_code == 401
    for token in ("nope", "thaw_abc", "thaw_000000000000_wrongsecret"):
        with cp.client(token) as c:
            r = c.get("/v1/functions")
            assert r.status_code == 401, token
            assert r.headers["WWW-Authenticate"] == "Bearer"
    # The right id with a wrong secret is refused too.
    good = cp.key("deploy")
    with cp.client(good[:-2] + "xx") as c:
        assert c.get("/v1/functions").status_code == 401


def test_create_list_revoke(cp: ControlPlane) -> None:
    with cp.client() as admin:
        r = admin.post("/v1/keys", json={"scopes": ["invoke"], "name": "ci"})
        assert r.status_code == 201
        token, key_id = r.json()["token"], r.json()["id"]
        assert token.startswith(f"thaw_{key_id}_")
        listed = admin.get("/v1/keys").json()
        assert key_id in [k["id"] for k in listed]
        assert all("token" not in k and "secret" not in str(k) for k in listed)
        with cp.client(token) as c:
            assert c.get("/v1/calls/nope").status_code == 404
        assert admin.delete(f"/v1/keys/{key_id}").json()["revoked_at"] is not None
        with cp.client(token) as c:
            assert c.get("/v1/calls/nope").status_code == 401
        assert admin.delete("/v1/keys/unknown").status_code == 404


def test_scopes_are_enforced_403(cp: ControlPlane) -> None:
    invoke_only = cp.key("invoke")
    with cp.client(invoke_only) as c:
        assert c.get("/v1/keys").status_code == 403
        r = c.post("/v1/functions", json=cp.spec())
        assert r.status_code == 403
        assert "deploy" in r.json()["detail"]
        assert c.get("/metrics").status_code == 403
    worker = cp.key("worker")
    with cp.client(worker) as c:
        assert c.post("/v1/functions/echo/invoke", json={"input": 1}).status_code == 403


def test_key_limited_to_one_function(cp: ControlPlane) -> None:
    cp.deploy("echo")
    cp.deploy("other")
    token = cp.key("invoke", "deploy", function="echo")
    with cp.client(token) as c:
        assert c.get("/v1/functions/echo").status_code == 200
        r = c.get("/v1/functions/other")
        assert r.status_code == 403
        assert "limited to function 'echo'" in r.json()["detail"]
        assert [f["name"] for f in c.get("/v1/functions").json()] == ["echo"]
        assert c.post("/v1/functions/other/invoke", json={"input": 1}).status_code == 403


def test_unknown_scope_is_422(cp: ControlPlane) -> None:
    with cp.client() as c:
        r = c.post("/v1/keys", json={"scopes": ["root"]})
        assert r.status_code == 422
        assert "scopes" in r.text


def test_openapi_document_needs_a_key_and_docs_are_off(cp: ControlPlane) -> None:
    assert httpx.get(cp.base_url + "/openapi.json").status_code == 401
    assert httpx.get(cp.base_url + "/docs").status_code == 404
    with cp.client(cp.key("invoke")) as c:
        doc = c.get("/openapi.json").json()
    assert "/v1/functions/{name}/invoke" in doc["paths"]
    assert "/openapi.json" not in doc["paths"]
