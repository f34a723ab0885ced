"""Deploying functions and the model catalog, over HTTP."""

from __future__ import annotations

from tests.control_plane.conftest import ControlPlane


def test_deploy_show_list_versions_and_rollback(cp: ControlPlane) -> None:
    first = cp.deploy("echo")
    assert first["version"] == 1 and first["versions"] == [1]
    assert first["model_digest"].startswith("blake3:")
    second = cp.deploy("echo", timeout_s=20)
    assert second["version"] == 2 and second["spec"]["timeout_s"] == 20
    with cp.client() as c:
        assert [f["name"] for f in c.get("/v1/functions").json()] == ["echo"]
        r = c.post("/v1/functions/echo/rollback", json={})
        assert r.json()["version"] == 1 and r.json()["spec"]["timeout_s"] == 10
        r = c.post("/v1/functions/echo/rollback", json={"version": 2})
        assert r.json()["version"] == 2
        assert c.post("/v1/functions/echo/rollback", json={"version": 9}).status_code == 404
        assert c.delete("/v1/functions/echo").status_code == 204
        assert c.get("/v1/functions/echo").status_code == 404
        assert c.delete("/v1/functions/echo").status_code == 404


def test_deploying_the_same_code_and_spec_again_makes_no_new_version(cp: ControlPlane) -> None:
    assert cp.deploy("same")["version"] == 1
    again = cp.deploy("same")
    assert again["version"] == 1 and again["versions"] == [1]
    changed = cp.deploy("same", timeout_s=20)
    assert changed["version"] == 2 and changed["versions"] == [1, 2]
    assert cp.deploy("same", timeout_s=20)["versions"] == [1, 2]
    # The same as an older version (not the active one) is a new version, not a rollback.
    assert cp.deploy("same")["versions"] == [1, 2, 3]


def test_spec_naming_missing_model_or_adapter_is_400_naming_it(cp: ControlPlane) -> None:
    with cp.client() as c:
        r = c.post("/v1/functions", json=cp.spec(model="nosuch-model:v1"))
        assert r.status_code == 400 and "nosuch-model:v1" in r.json()["detail"]
        adapters = [{"name": "fr", "ref": "nosuch-lora:v3"}]
        r = c.post("/v1/functions", json=cp.spec(adapters=adapters))
        assert r.status_code == 400 and "nosuch-lora:v3" in r.json()["detail"]
        # An adapter given as the model is refused by kind.
        r = c.post("/v1/functions", json=cp.spec(model=cp.store.adapter_refs[0]))
        assert r.status_code == 400 and "adapter, not a model" in r.json()["detail"]


def test_bundle_that_does_not_import_fails_and_previous_version_keeps_serving(
    cp: ControlPlane,
) -> None:
    cp.deploy("echo")
    with cp.client() as c:
        r = c.post("/v1/functions", json=cp.spec(bundle=cp.store.bad_bundle))
        assert r.status_code == 400
        assert "thaw_module_that_does_not_exist" in r.json()["detail"]
        shown = c.get("/v1/functions/echo").json()
        assert shown["version"] == 1 and shown["versions"] == [1]
        r = c.post("/v1/functions", json=cp.spec(entry="app:Missing"))
        assert r.status_code == 400 and "Missing" in r.json()["detail"]
        r = c.post("/v1/functions", json=cp.spec(bundle=cp.store.no_call_bundle))
        assert r.status_code == 400 and "__call__" in r.json()["detail"]


def test_malformed_spec_is_422_naming_the_field(cp: ControlPlane) -> None:
    with cp.client() as c:
        r = c.post("/v1/functions", json=cp.spec(entry="not-an-entry"))
        assert r.status_code == 422 and "entry" in r.text
        bad_scaling = {"min_replicas": 3, "max_replicas": 1}
        r = c.post("/v1/functions", json=cp.spec(scaling=bad_scaling))
        assert r.status_code == 422 and "min_replicas" in r.text
        r = c.post(
            "/v1/functions", content=b"{not json", headers={"content-type": "application/json"}
        )
        assert r.status_code == 422


def test_models_list_show_and_delete_guarded_by_use(cp: ControlPlane) -> None:
    with cp.client() as c:
        listed = {f"{m['name']}:{m['tag']}": m for m in c.get("/v1/models").json()}
        model = listed[cp.store.model_ref]
        assert model["kind"] == "model" and model["raw_size_bytes"] > 0
        assert model["stored_size_bytes"] > 0 and model["digest"].startswith("blake3:")
        assert listed[cp.store.adapter_refs[0]]["kind"] == "adapter"
        assert not any(k.startswith("bundles/") for k in listed)
        shown = c.get(f"/v1/models/{cp.store.model_ref}").json()
        assert shown["digest"] == model["digest"]
        assert c.get("/v1/models/nosuch:v1").status_code == 404
        assert c.get("/v1/models/BAD NAME").status_code == 400

        cp.deploy("echo", adapters=[{"name": "fr", "ref": cp.store.adapter_refs[1]}])
        r = c.delete(f"/v1/models/{cp.store.model_ref}")
        assert r.status_code == 409 and "echo" in r.json()["detail"]
        r = c.delete(f"/v1/models/{cp.store.adapter_refs[1]}")
        assert r.status_code == 409 and "echo" in r.json()["detail"]
        assert c.get(f"/v1/models/{cp.store.model_ref}").status_code == 200


def test_delete_unused_model_tag(cp: ControlPlane) -> None:
    from snapshotter.registry import Registry
    from snapshotter.stores import LocalStore

    registry = Registry(LocalStore(cp.store.root))
    registry.set_tag("spare-model:v1", registry.resolve(cp.store.model_ref))
    with cp.client() as c:
        r = c.delete("/v1/models/spare-model:v1")
        assert r.status_code == 200 and r.json()["name"] == "spare-model"
        assert c.get("/v1/models/spare-model:v1").status_code == 404
