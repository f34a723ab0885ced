"""The canary card in a real browser: old and new side by side, then promote."""

from __future__ import annotations

from typing import Any

import pytest

from tests.web.conftest import CHROMIUM, Console, sign_in
from tests.web.platform import Platform
from tests.web.test_console import BUNDLES, deploy_via_api, open_function

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="/usr/bin/chromium is missing; `make system-deps` installs it"
)


def deploy_canary(platform: Platform, name: str, weight_pct: float) -> None:
    """A second version of the streamer bundle as ``name``'s canary."""
    folder = BUNDLES / "streamer"
    files = [("files", (p.name, p.read_bytes())) for p in sorted(folder.iterdir())]
    paths = [f"streamer/{p.name}" for p in sorted(folder.iterdir())]
    with platform.client() as c:
        r = c.post(
            "/v1/uploads",
            data={"ref": f"bundles/{name}:v2", "kind": "bundle", "paths": paths},
            files=files,
        )
        assert r.status_code == 201, r.text
        spec = {**r.json()["spec"], "name": name, "bundle": r.json()["digest"]}
        r = c.post("/v1/functions", params={"canary_pct": weight_pct}, json=spec)
        assert r.status_code == 201, r.text


def test_canary_side_by_side_then_promote(console: Console, platform: Platform) -> None:
    deploy_via_api(platform, "canaried")
    deploy_canary(platform, "canaried", 50)
    with platform.client() as c:
        for _ in range(4):
            r = c.post("/v1/functions/canaried/invoke", json={"input": {"n": 1}}, timeout=120)
            assert r.status_code == 200, r.text
    page: Any = console.page
    sign_in(console, platform.admin_key)
    open_function(console, platform, "canaried")
    page.get_by_role("heading", name="Canary: v2 takes 50% of calls").wait_for()
    table = page.locator("#canary-table table")
    table.get_by_role("columnheader", name="v1 (active)").wait_for()
    table.get_by_role("columnheader", name="v2 (canary, 50%)").wait_for()
    for row in ("p50", "p99", "First output p95", "Error rate", "Cold-start rate"):
        table.get_by_role("rowheader", name=row, exact=True).wait_for()
    calls = table.get_by_role("row").filter(has_text="Calls").inner_text()
    assert sum(int(n) for n in calls.split()[1:]) == 4  # every call, on one side or the other
    console.screenshot("canary")
    page.get_by_role("button", name="Promote v2").click()
    page.get_by_role("alert").get_by_text("Promoted: version 2 is active").wait_for()
    with platform.client() as c:
        fn = c.get("/v1/functions/canaried").json()
        assert fn["version"] == 2 and fn["canary"] is None
    assert page.locator("#canary-table").count() == 0
    console.assert_clean()
