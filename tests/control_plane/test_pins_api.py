"""Deploying pins every digest a version uses; deleting the function unpins them."""

from __future__ import annotations

from snapshotter import pins
from snapshotter.registry import Registry
from snapshotter.stores import LocalStore
from tests.control_plane.conftest import ControlPlane


def _pinned(registry: Registry, owner: str) -> set[str]:
    store = registry.store
    prefix = f"{pins.PREFIX}{owner.rstrip('/')}/"
    return {store.get(k).decode() for k in store.list(prefix)}


def test_deploy_pins_model_adapters_and_bundle_and_delete_unpins(cp: ControlPlane) -> None:
    registry = Registry(LocalStore(cp.store.root))
    adapter = cp.store.adapter_refs[0]
    cp.deploy("pinned", adapters=[{"name": "a0", "ref": adapter}])
    cp.deploy("pinned")  # version 2: no adapter
    want_v1 = {
        registry.resolve(cp.store.model_ref),
        registry.resolve(adapter),
        cp.store.good_bundle,
    }
    assert _pinned(registry, pins.function_owner("pinned", 1)) == want_v1
    assert _pinned(registry, pins.function_owner("pinned", 2)) == want_v1 - {
        registry.resolve(adapter)
    }
    with cp.client() as c:
        assert c.delete("/v1/functions/pinned").status_code == 204
    assert _pinned(registry, pins.function_owner("pinned")) == set()
