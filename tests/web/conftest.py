"""Browser tests of the console: Debian's Chromium driven by Playwright, against a
real ``thaw server`` and ``thaw worker`` (see ``platform.py``).

Skipped, saying why, only when ``/usr/bin/chromium`` is missing (``make test``
installs it through ``system-deps``). Never ``playwright install``: the browser
is the system one.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from snapshotter.push import push_directory
from snapshotter.registry import Registry
from snapshotter.stores import LocalStore
from tests.web.platform import Platform, running_platform

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
MODEL_REF = "llama-tiny:v1"
ADAPTER_REF = "llama-lora0:v1"


@pytest.fixture(scope="session")
def platform(
    tmp_path_factory: pytest.TempPathFactory, llama_dir: Path, adapter_dirs: list[Path]
) -> Iterator[Platform]:
    if not CHROMIUM.exists():
        pytest.skip("/usr/bin/chromium is missing; `make system-deps` installs it")
    root = tmp_path_factory.mktemp("web-platform")
    registry = Registry(LocalStore(root / "store"))
    push_directory(llama_dir, MODEL_REF, registry)
    push_directory(adapter_dirs[0], ADAPTER_REF, registry)
    with running_platform(root / "home", root / "store") as p:
        yield p


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    if not CHROMIUM.exists():
        pytest.skip("/usr/bin/chromium is missing; `make system-deps` installs it")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield b
        b.close()


# The browser logs every 4xx/5xx response as a console error. A test that
# provokes one on purpose names its status; anything else fails the test.
NETWORK_LOG = re.compile(r"Failed to load resource: the server responded with a status of (\d+)")


@dataclass
class Console:
    """A page with its console errors and uncaught page errors collected."""

    page: object
    shots: Path
    errors: list[str] = field(default_factory=list)

    def screenshot(self, name: str) -> Path:
        path = self.shots / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)  # type: ignore[attr-defined]
        print(f"screenshot: {path}")
        return path

    def assert_clean(self, expected_statuses: tuple[int, ...] = ()) -> None:
        unexpected = []
        for e in self.errors:
            m = NETWORK_LOG.search(e)
            if m is None or int(m.group(1)) not in expected_statuses:
                unexpected.append(e)
        assert not unexpected, f"console or page errors: {unexpected}"


@pytest.fixture
def console(
    browser: object, platform: Platform, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Console]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})  # type: ignore[attr-defined]
    page = context.new_page()
    page.set_default_timeout(20_000)
    c = Console(page, tmp_path_factory.mktemp("screenshots"))
    page.on("console", lambda m: c.errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: c.errors.append(f"pageerror: {e}"))
    page.goto(platform.base_url + "/")
    yield c
    context.close()


def sign_in(c: Console, key: str) -> None:
    page = c.page
    page.get_by_label("API key").fill(key)  # type: ignore[attr-defined]
    page.get_by_role("button", name="Sign in").click()  # type: ignore[attr-defined]
    # Until the key is checked, a page the test opens may be rendered twice.
    page.locator("#signout:visible, #message:visible").first.wait_for()  # type: ignore[attr-defined]
