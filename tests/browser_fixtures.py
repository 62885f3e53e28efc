"""Headless Chromium (the system's, driven by Playwright) for the web pages' tests: the browser, a logged-in
page that records every console error, and a poll of the page's state from outside it.

Importing this module skips the importing test module where there is no Chromium, unless
KERNELLOOP_REQUIRE_BROWSER=1 (CI sets it): there a missing browser or driver is a failure.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO
from server_fixtures import TOKEN, ServiceProcess

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser")) if p), None)
REQUIRED = os.environ.get("KERNELLOOP_REQUIRE_BROWSER") == "1"
if CHROMIUM is None and not REQUIRED:
    pytest.skip("no chromium here: the browser tests need it (apt-get install chromium)", allow_module_level=True)
if REQUIRED:
    from playwright import sync_api as playwright_api  # CI: a missing driver is a failure, not a skip
else:
    playwright_api = pytest.importorskip(
        "playwright.sync_api", reason="the browser tests drive Chromium with Playwright"
    )


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """Chromium for one test module (a module takes it with `browser = browser_fixtures.browser`)."""
    with playwright_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield launched
        launched.close()


@pytest.fixture
def visit(browser, seeded) -> Iterator[Visit]:
    """A logged-in page on the module's service (its `seeded` fixture yields the service first); the test fails
    on any console error the page logged."""
    opened = Visit(browser, seeded[0])
    yield opened
    opened.close()
    assert not opened.errors, opened.errors


def until(page, expression: str, timeout_s: float = 10.0) -> object:
    """Poll a JavaScript expression from outside the page until it is truthy (the pages' Content-Security-Policy
    refuses the string evaluation that Playwright's wait_for_function polls with, as it should)."""
    deadline = time.monotonic() + timeout_s
    while not (value := page.evaluate(f"() => {expression}")):
        assert time.monotonic() < deadline, f"never true: {expression}"
        time.sleep(0.1)
    return value


def screenshot_folder(tmp_path: Path) -> Path:
    """Where a page test's screenshot goes: the test's folder, or docs/screenshots/ with
    KERNELLOOP_UPDATE_SCREENSHOTS=1 (the README shows those)."""
    if os.environ.get("KERNELLOOP_UPDATE_SCREENSHOTS") == "1":
        return REPO / "docs" / "screenshots"
    return tmp_path


class Visit:
    """A logged-in page that records every console error and uncaught exception."""

    def __init__(self, browser, service: ServiceProcess, width: int = 1200, javascript: bool = True):
        self.context = browser.new_context(
            viewport={"width": width, "height": 900}, java_script_enabled=javascript, accept_downloads=True
        )
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("response", lambda r: self.errors.append(f"{r.status} {r.url}") if r.status >= 400 else None)
        self.base = service.url

    def log_in(self, path: str) -> None:
        self.page.goto(self.base + path)
        assert self.page.url.startswith(self.base + "/login"), self.page.url  # no token yet: the form
        self.page.fill("#token", TOKEN)
        self.page.click("form.login button")
        self.page.wait_for_load_state("load")
        assert self.page.url == self.base + path, self.page.url

    def close(self) -> None:
        self.context.close()
