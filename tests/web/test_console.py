"""The console in a real browser against a real server and worker: sign in, deploy,
invoke with streaming, charts, scaling, warm-up, keys, models, workers, and the
messages a bad key, a failed deploy and a failed call put on the page."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.web.conftest import ADAPTER_REF, CHROMIUM, MODEL_REF, Console, sign_in
from tests.web.platform import Platform

BUNDLES = Path(__file__).parent / "bundles"

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="/usr/bin/chromium is missing; `make system-deps` installs it"
)


def chart_data(c: Console, canvas_id: str) -> dict[str, Any]:
    """What the Chart.js chart on ``canvas_id`` currently draws: labels and datasets."""
    return c.page.evaluate(  # type: ignore[attr-defined,no-any-return]
        """(id) => {
            const chart = Chart.getChart(document.getElementById(id));
            if (!chart) return null;
            return {labels: chart.data.labels,
                    datasets: chart.data.datasets.map(d => ({label: d.label, data: d.data}))};
        }""",
        canvas_id,
    )


def dataset_total(data: dict[str, Any], label: str) -> float:
    return sum(sum(d["data"]) for d in data["datasets"] if d["label"] == label)


def wait_for_chart(c: Console, canvas_id: str, condition_js: str) -> dict[str, Any]:
    """Wait until the chart on ``canvas_id`` satisfies ``condition_js`` (a function of
    its ``data``); charts redraw after the page's own stats request returns."""
    c.page.wait_for_function(  # type: ignore[attr-defined]
        """([id, cond]) => {
            const chart = Chart.getChart(document.getElementById(id));
            return !!chart && new Function("data", "return " + cond)(chart.data);
        }""",
        arg=[canvas_id, condition_js],
        timeout=30_000,
    )
    return chart_data(c, canvas_id)


def series_total_js(label: str, total: int) -> str:
    return (
        f"data.datasets.filter(d => d.label === {label!r})"
        f".reduce((s, d) => s + d.data.reduce((a, b) => a + b, 0), 0) === {total}"
    )


def deploy_via_api(
    platform: Platform, name: str, again: bool = False, bundle: str = "streamer"
) -> None:
    """Deploy ``bundle`` (the streamer by default) as ``name`` through the REST API
    (setup for a test); ``again`` deploys a new version even when the function exists:
    its spec differs (an environment variable), since a deploy that repeats the serving
    version makes none."""
    folder = BUNDLES / bundle
    files = [("files", (p.name, p.read_bytes())) for p in sorted(folder.iterdir())]
    paths = [f"{bundle}/{p.name}" for p in sorted(folder.iterdir())]
    with platform.client() as c:
        if c.get(f"/v1/functions/{name}").status_code == 200 and not again:
            return
        r = c.post(
            "/v1/uploads",
            data={"ref": f"bundles/{name}:v1", "kind": "bundle", "paths": paths},
            files=files,
        )
        assert r.status_code == 201, r.text
        spec = {**r.json()["spec"], "name": name, "bundle": r.json()["digest"]}
        if again:
            spec["env"] = {**(spec.get("env") or {}), "DEPLOY": "again"}
        assert c.post("/v1/functions", json=spec).status_code == 201


def open_function(c: Console, platform: Platform, name: str) -> None:
    c.page.goto(f"{platform.base_url}/#/function/{name}")  # type: ignore[attr-defined]
    c.page.get_by_role("heading", name=f"Function {name}").wait_for()  # type: ignore[attr-defined]


def test_bad_key_says_so_on_the_page(console: Console) -> None:
    sign_in(console, "thaw_000000000000_not-a-real-secret")
    alert = console.page.get_by_role("alert")  # type: ignore[attr-defined]
    alert.get_by_text("That API key is not valid").wait_for()
    assert console.page.get_by_label("API key").is_visible()  # type: ignore[attr-defined]
    console.screenshot("bad-key")
    console.assert_clean(expected_statuses=(401,))


def test_deploy_from_console_then_stream_and_see_it_in_the_charts(
    console: Console, platform: Platform
) -> None:
    page: Any = console.page
    sign_in(console, platform.admin_key)
    page.get_by_role("link", name="Deploy", exact=True).click()
    page.get_by_label("Code folder (with thaw.toml)").set_input_files(BUNDLES / "streamer")
    page.get_by_role("button", name="Upload code").click()
    page.get_by_role("alert").get_by_text("filled from its thaw.toml").wait_for()
    assert page.get_by_label("Name", exact=True).input_value() == "streamer"
    assert page.get_by_label("Model").input_value() == MODEL_REF
    assert page.get_by_label("Code bundle digest").input_value().startswith("blake3:")
    assert page.locator("#bundle-progress").evaluate("p => p.value") == 100
    page.get_by_role("button", name="Deploy", exact=True).click()
    page.get_by_role("heading", name="Function streamer").wait_for()
    page.get_by_role("alert").get_by_text("Deployed streamer version 1").wait_for()

    # Stream: the first word shows while the call is still running.
    page.get_by_label("Input (JSON)").fill('{"prompt": "one two three", "delay_s": 1.0}')
    page.get_by_label("Adapter").select_option("lora0")
    invoke = page.get_by_role("button", name="Invoke")
    invoke.click()
    output = page.locator("#pg-output")
    output.get_by_text('"token":"one"').wait_for(timeout=60_000)
    assert invoke.is_disabled(), "the first output arrived only after the call ended"
    assert '"token":"three"' not in output.inner_text()
    page.locator("#pg-info").get_by_text("succeeded, cold").wait_for(timeout=30_000)
    text = output.inner_text()
    assert '"token":"three"' in text and '"adapter":"lora0"' in text

    hist = wait_for_chart(console, "latency-chart", series_total_js("cold", 1))
    assert dataset_total(hist, "cold") == 1 and dataset_total(hist, "warm") == 0
    waterfall = wait_for_chart(console, "waterfall-chart", "data.labels.length >= 1")
    phases = {d["label"] for d in waterfall["datasets"]}
    assert len(waterfall["labels"]) == 1 and {"schedule", "weights_fetch"} <= phases
    # A second call is warm and lands in the histogram's other series.
    page.get_by_label("Stream the output").uncheck()
    invoke.click()
    page.locator("#pg-info").get_by_text("succeeded, warm").wait_for(timeout=30_000)
    hist = wait_for_chart(console, "latency-chart", series_total_js("warm", 1))
    assert dataset_total(hist, "warm") == 1 and dataset_total(hist, "cold") == 1
    stats = page.locator("#fn-stats").inner_text()
    assert "serving" in stats and "50%" in stats
    console.screenshot("function-after-calls")
    console.assert_clean()


def test_functions_list_shows_stats(console: Console, platform: Platform) -> None:
    deploy_via_api(platform, "listed")
    with platform.client() as c:
        r = c.post("/v1/functions/listed/invoke", json={"input": {"prompt": "hi"}})
        assert r.status_code == 200, r.text
    sign_in(console, platform.admin_key)
    row = console.page.locator('tr[data-function="listed"]')  # type: ignore[attr-defined]
    row.wait_for()
    cells = row.inner_text()
    assert "serving" in cells and "1 ready" in cells
    calls = row.locator("td").nth(3)
    before = int(calls.inner_text().split()[0])
    with platform.client() as c:
        assert c.post("/v1/functions/listed/invoke", json={"input": {}}).status_code == 200
    # The list refreshes itself: the new call shows up without a reload.
    calls.get_by_text(str(before + 1), exact=True).wait_for(timeout=15_000)
    console.screenshot("functions")
    console.assert_clean()


def test_scaling_edit_and_warm_up(console: Console, platform: Platform) -> None:
    deploy_via_api(platform, "scaled")
    page: Any = console.page
    sign_in(console, platform.admin_key)
    open_function(console, platform, "scaled")
    page.get_by_label("Max replicas").fill("2")
    page.get_by_label("Idle timeout (s)").fill("120")
    page.get_by_label("Target concurrency").fill("3")
    page.get_by_role("button", name="Save scaling").click()
    page.get_by_role("alert").get_by_text("Scaling saved").wait_for()
    with platform.client() as c:
        scaling = c.get("/v1/functions/scaled").json()["spec"]["scaling"]
    assert scaling == {
        "min_replicas": 0,
        "max_replicas": 2,
        "idle_timeout_s": 120.0,
        "target_concurrency": 3,
    }
    page.reload()
    assert page.get_by_label("Max replicas").input_value() == "2"
    # An invalid edit is refused with the server's reason, on the page.
    page.get_by_label("Min replicas").fill("5")
    page.get_by_role("button", name="Save scaling").click()
    page.get_by_role("alert").get_by_text("exceeds max_replicas").wait_for()
    page.get_by_label("Min replicas").fill("0")
    page.get_by_role("button", name="Warm up").click()
    page.get_by_role("alert").get_by_text("Warming up").wait_for()
    deadline = time.monotonic() + 60
    with platform.client() as c:
        while c.get("/v1/functions/scaled/stats").json()["status"] != "serving":
            assert time.monotonic() < deadline, "the warm-up never became ready"
            time.sleep(0.2)
    page.get_by_role("button", name="Refresh").click()
    page.locator("#fn-stats").get_by_text("serving").wait_for()
    console.screenshot("scaling-warm")
    console.assert_clean(expected_statuses=(422,))


def test_failed_deploy_and_failed_call_show_messages(console: Console, platform: Platform) -> None:
    deploy_via_api(platform, "failing")
    page: Any = console.page
    sign_in(console, platform.admin_key)
    page.get_by_role("link", name="Deploy", exact=True).click()
    page.get_by_label("Code folder (with thaw.toml)").set_input_files(BUNDLES / "broken")
    page.get_by_role("button", name="Upload code").click()
    page.get_by_role("alert").get_by_text("filled from its thaw.toml").wait_for()
    page.get_by_role("button", name="Deploy", exact=True).click()
    alert = page.get_by_role("alert")
    alert.get_by_text("Deploy failed").wait_for(timeout=60_000)
    assert "thaw_module_that_does_not_exist" in alert.inner_text()
    console.screenshot("failed-deploy")

    open_function(console, platform, "failing")
    page.get_by_label("Input (JSON)").fill('{"fail": "on purpose"}')
    page.get_by_role("button", name="Invoke").click()
    alert.get_by_text("asked to fail: on purpose").wait_for(timeout=60_000)
    assert "failed" in page.locator("#pg-info").inner_text()
    console.screenshot("failed-call")
    page.get_by_label("Input (JSON)").fill("{not json")
    page.get_by_role("button", name="Invoke").click()
    alert.get_by_text("not valid JSON").wait_for()
    console.screenshot("invalid-input")
    console.assert_clean(expected_statuses=(400,))


def test_a_function_whose_setup_fails_is_drawn_failing(
    console: Console, platform: Platform
) -> None:
    deploy_via_api(platform, "setup-fails", bundle="setup_fails")
    with platform.client() as c:
        r = c.post("/v1/functions/setup-fails/invoke", json={"input": {}})
        assert r.status_code == 500, r.text
        health = c.get("/v1/functions/setup-fails").json()["health"]
    assert health["state"] == "failing", health
    assert "setup failed on purpose" in health["last_error"]
    page: Any = console.page
    sign_in(console, platform.admin_key)
    row = page.locator('tr[data-function="setup-fails"]')
    row.get_by_text("failing", exact=True).wait_for()
    console.screenshot("functions-failing")
    open_function(console, platform, "setup-fails")
    note = page.locator("#fn-health")
    note.get_by_text("failing", exact=True).wait_for()
    assert "setup failed on purpose" in note.inner_text()
    console.screenshot("function-failing")
    console.assert_clean()


def test_create_then_revoke_a_key(console: Console, platform: Platform) -> None:
    page: Any = console.page
    sign_in(console, platform.admin_key)
    page.get_by_role("link", name="Keys").click()
    page.get_by_label("Name").fill("browser-made")
    page.get_by_label("deploy").check()
    page.get_by_role("button", name="Create key").click()
    token = page.locator("#new-key-token").inner_text()
    assert token.startswith("thaw_")
    with platform.client(token) as c:
        assert c.get("/v1/functions").status_code == 200
    key_id = token.split("_")[1]
    row = page.locator(f'tr[data-key="{key_id}"]')
    assert "deploy, invoke" in row.inner_text()
    page.get_by_role("button", name=f"Revoke key {key_id}").click()
    row.get_by_text("revoked").wait_for()
    with platform.client(token) as c:
        assert c.get("/v1/functions").status_code == 401
    console.screenshot("keys")
    console.assert_clean()


def test_upload_a_model_folder_and_see_sizes_and_workers(
    console: Console, platform: Platform, adapter_dirs: list[Path]
) -> None:
    deploy_via_api(platform, "listed")
    with platform.client() as c:  # a replica that has loaded the model
        assert c.post("/v1/functions/listed/invoke", json={"input": {}}).status_code == 200
    page: Any = console.page
    sign_in(console, platform.admin_key)
    page.get_by_role("link", name="Models & adapters").click()
    page.get_by_label("Name:tag").fill("uploaded-lora:v1")
    page.get_by_label("Folder (Hugging Face or PEFT layout)").set_input_files(adapter_dirs[1])
    page.get_by_role("button", name="Upload").click()
    page.get_by_role("alert").get_by_text("Uploaded uploaded-lora:v1").wait_for(timeout=60_000)
    assert page.locator("#model-progress").evaluate("p => p.value") == 100
    assert "(adapter)" in page.locator("#model-upload-status").inner_text()
    uploaded = page.locator('tr[data-ref="uploaded-lora:v1"]')
    assert "adapter" in uploaded.inner_text() and "none" in uploaded.inner_text()
    model_row = page.locator(f'tr[data-ref="{MODEL_REF}"]').inner_text()
    assert "listed" in model_row
    assert page.locator(f'tr[data-ref="{ADAPTER_REF}"]').is_visible()
    console.screenshot("models")

    page.get_by_role("link", name="Workers").click()
    card = page.locator("section.worker").first
    card.get_by_text("browser-test-worker").wait_for()
    text = card.inner_text()
    assert "cpu" in text and "Pre-warmed pool" in text and "disk:" in text
    assert "listed v1 ready" in text
    # The disk tier says what it holds (by name) or that it holds nothing whole yet;
    # what exactly depends on the worker's last inventory, so only the shape is checked.
    assert "holds no complete artifact" in text or MODEL_REF in text
    console.screenshot("workers")
    console.assert_clean()


def test_roll_back_in_one_click(console: Console, platform: Platform) -> None:
    deploy_via_api(platform, "rolled")
    deploy_via_api(platform, "rolled", again=True)
    page: Any = console.page
    sign_in(console, platform.admin_key)
    open_function(console, platform, "rolled")
    assert "v2" in page.get_by_role("heading", name="Function rolled").inner_text()
    page.get_by_role("button", name="Roll back to version 1").click()
    page.get_by_role("alert").get_by_text("Rolled back: version 1 is active").wait_for()
    with platform.client() as c:
        assert c.get("/v1/functions/rolled").json()["version"] == 1
    page.get_by_role("button", name="Roll back to version 2").wait_for()
    console.screenshot("rolled-back")
    console.assert_clean()


UNLABELED_CONTROLS = """() => [...document.querySelectorAll('input, select, textarea')]
    .filter(el => !(el.labels && el.labels.length) && !el.getAttribute('aria-label'))
    .map(el => el.outerHTML)"""


@pytest.mark.parametrize("width", [1280, 768])
def test_usable_at_width_and_by_keyboard(console: Console, platform: Platform, width: int) -> None:
    deploy_via_api(platform, "listed")
    page: Any = console.page
    page.set_viewport_size({"width": width, "height": 900})
    # Sign in with the keyboard only.
    page.keyboard.type(platform.admin_key)  # the key field has focus on load
    page.keyboard.press("Enter")
    headings = {
        "Functions": "Functions",
        "Deploy": "Deploy a function",
        "Models & adapters": "Models and adapters",
        "Workers": "Workers",
        "Keys": "API keys",
    }
    for section, heading in headings.items():
        page.get_by_role("link", name=section, exact=True).click()
        page.get_by_role("heading", name=heading, exact=True).wait_for()
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"{section} scrolls sideways by {overflow} px at {width} px"
        assert page.evaluate(UNLABELED_CONTROLS) == [], f"{section} has unlabeled controls"
    open_function(console, platform, "listed")
    # Each page, once drawn, puts focus on its heading.
    page.wait_for_function("document.activeElement.tagName === 'H2'")
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"the function page scrolls sideways by {overflow} px at {width} px"
    # The skip link moves focus to the content without changing the page.
    page.locator("a.skip").focus()
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.id") == "main"
    assert page.url.endswith("#/function/listed")
    # Tab reaches the Invoke button, and focus is drawn.
    page.get_by_label("Input (JSON)").focus()
    for _ in range(6):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.textContent") == "Invoke":
            break
    assert page.evaluate("document.activeElement.textContent") == "Invoke"
    outline = page.evaluate("getComputedStyle(document.activeElement).outlineStyle")
    assert outline not in ("", "none")
    assert page.evaluate(UNLABELED_CONTROLS) == []
    console.screenshot(f"function-{width}px")
    console.assert_clean()
