"""The web pages in a real browser: headless Chromium (the system's, driven by Playwright) against a service
with a token, seeded with a real CPU run of the search and one attempt that does not compile.

Each page is loaded as a person would reach it (the login form first), and checked for what they would see:
the plot has one point per step, the tables their rows, the diagnostic sits under its line, no console error.
The run page's screenshot lands in the test's folder, or in docs/screenshots/ with KERNELLOOP_UPDATE_SCREENSHOTS=1.
Without Chromium the tests skip, unless KERNELLOOP_REQUIRE_BROWSER=1 (CI sets it).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import browser_fixtures
import httpx
import pytest
from browser_fixtures import Visit, screenshot_folder, until
from conftest import CPU_EXAMPLE, PROBLEM, REPO, line_of, run_kernelloop
from server_fixtures import COUNTED_EVAL, TOKEN, ServiceProcess, python_conv, submission

pytestmark = pytest.mark.scenario  # a whole-system scenario: `make test` runs it, `make test-fast` does not
browser, visit = browser_fixtures.browser, browser_fixtures.visit  # the fixtures: Chromium, a logged-in page

SEARCH_STEPS = 1  # the baseline; the compile error added to the run is its child
BROKEN = CPU_EXAMPLE.replace("def forward(self, x):", "def forward(self, x)  # DELIBERATE-ERROR")


@pytest.fixture(scope="module")
def seeded() -> Iterator[tuple[ServiceProcess, dict]]:
    """A service whose history holds one search run on the CPU, and a compile error added to that run."""
    service = ServiceProcess("web").start()
    try:
        env = {**os.environ, "KERNELLOOP_API_TOKEN": TOKEN}
        done = run_kernelloop(
            "agent", "run", "--problem", PROBLEM, "--backend", "cpu", "--proposer", "search",
            "--iterations", str(SEARCH_STEPS), "--server", service.url, "--json",
            env=env, cwd=REPO, timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        with service.client() as api:
            (run,) = api.get("/v1/runs").json()["items"]
            body = submission(BROKEN, run_id=run["id"], parent_attempt_id=run["best_attempt_id"])
            job = api.post("/v1/compile", json=body).json()
            assert job["outcome"] == "compile_error", job
            run = api.get(f"/v1/runs/{run['id']}").json()
        yield service, run
    finally:
        service.stop()


def test_the_run_page_plots_one_point_per_step_and_lists_every_attempt(visit: Visit, seeded, tmp_path: Path) -> None:
    _, run = seeded
    steps = SEARCH_STEPS + 1  # the search's attempts and the compile error
    assert run["attempts"] == steps and run["status"] == "finished", run
    visit.log_in(f"/runs/{run['id']}")
    page = visit.page
    until(page, "window.kernelloopChart !== undefined")

    assert page.locator("#attempt-rows tr").count() == steps
    assert page.locator("#chart canvas").count() == 1
    points = page.evaluate(
        """() => {
            const data = window.kernelloopChart.plot.data;
            return data[0].map((x, i) => ({x, marked: data.slice(1).filter(s => s[i] !== null).length,
                                          geomean: data[1][i]}));
        }"""
    )
    assert [p["x"] for p in points] == list(range(1, steps + 1))
    assert all(p["marked"] >= 1 for p in points), points  # every step is drawn: a speedup or a failure marker
    assert [p["geomean"] is not None for p in points] == [True] * SEARCH_STEPS + [False], points
    labels = page.evaluate("() => window.kernelloopChart.plot.series.map(s => s.label)")
    assert "geomean speedup" in labels and "compile_error" in labels, labels
    assert page.locator("#run-status").inner_text() == "finished"
    shot = screenshot_folder(tmp_path) / "search-run-page.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000


def test_the_problem_and_runs_pages_lead_to_the_best_attempt(visit: Visit, seeded) -> None:
    _, run = seeded
    visit.log_in("/")
    best = visit.page.locator(f"#problem-{PROBLEM} ~ td ol.leaders a").first
    assert best.inner_text() == f"{run['best_speedup']:.2f}x"
    visit.page.goto(visit.base + "/runs")
    row = visit.page.locator(f"#runs tbody tr:has(a[href='/runs/{run['id']}'])")
    cells = row.locator("td").all_inner_texts()
    assert cells[1:5] == [PROBLEM, "infer", "finished", "search"], cells
    assert cells[5] == f"{run['best_speedup']:.2f}x" and cells[6] == str(run["attempts"])
    row.locator(f"a[href='/attempts/{run['best_attempt_id']}']").click()
    visit.page.wait_for_load_state("load")
    assert visit.page.url.endswith(f"/attempts/{run['best_attempt_id']}")
    timing = visit.page.locator("#timing tbody tr")
    assert timing.count() >= 1 and "x" in timing.first.locator("td").nth(3).inner_text()

    with seeded[0].client() as api:
        attempts = api.get("/v1/attempts", params={"run_id": run["id"], "sort": "id", "order": "asc"}).json()["items"]
    child = next(a for a in attempts if a["parent_id"] is not None)  # the compile error, from the baseline
    visit.page.goto(f"{visit.base}/attempts/{child['id']}")
    assert visit.page.locator("#against").input_value() == str(child["parent_id"])
    assert visit.page.locator("#diff .add").count() >= 1 and visit.page.locator("#diff .del").count() >= 1


def test_the_attempt_page_pins_the_diagnostic_under_its_line(visit: Visit, seeded) -> None:
    service, run = seeded
    with service.client() as api:
        items = api.get("/v1/attempts", params={"run_id": run["id"], "status": "compile_error"}).json()["items"]
    (broken,) = items
    visit.log_in(f"/attempts/{broken['id']}")
    line = line_of(BROKEN, "DELIBERATE-ERROR")
    flagged = visit.page.locator("#code tr.has-diag")
    assert flagged.count() == 1 and flagged.first.get_attribute("id") == f"L{line}"
    note = visit.page.locator(f"#L{line} + tr.diag")
    assert "error" in note.inner_text() and "DELIBERATE-ERROR" in visit.page.locator(f"#L{line}").inner_text()
    assert visit.page.locator("#code .k").count() > 0  # keywords highlighted


def test_a_running_run_shows_new_attempts_and_its_end_without_a_reload(visit: Visit, seeded) -> None:
    service, _ = seeded
    with service.client() as api:
        run = api.post("/v1/runs", json={"problem": PROBLEM, "proposer": "human", "name": "live"}).json()
        visit.log_in(f"/runs/{run['id']}")
        until(visit.page, "window.kernelloopChart !== undefined")
        assert visit.page.locator("#attempt-rows tr").count() == 0
        job = api.post("/v1/compile", json=submission(BROKEN, run_id=run["id"])).json()
        assert job["outcome"] == "compile_error", job
        until(visit.page, "document.querySelectorAll('#attempt-rows tr').length === 1")
        assert visit.page.evaluate("() => window.kernelloopChart.steps.length") == 1
        api.patch(f"/v1/runs/{run['id']}", json={"status": "finished"})
        until(visit.page, "document.querySelector('#run-status').innerText === 'finished'")


def test_the_live_page_polls_on_after_a_proxys_502(visit: Visit, seeded) -> None:
    # one non-OK answer (a proxy's 502 while the service restarted) stopped the polling for good
    service, _ = seeded
    failed: list[str] = []

    def flaky(route) -> None:  # the first two polls meet a proxy with no service behind it
        if len(failed) < 2:
            failed.append(route.request.url)
            route.fulfill(status=502, body="Bad Gateway", content_type="text/plain")
        else:
            route.continue_()

    with service.client() as api:
        run = api.post("/v1/runs", json={"problem": PROBLEM, "proposer": "human", "name": "flaky"}).json()
        visit.page.route("**/runs/*/live", flaky)
        visit.log_in(f"/runs/{run['id']}")
        until(visit.page, "window.kernelloopChart !== undefined")
        job = api.post("/v1/compile", json=submission(BROKEN, run_id=run["id"])).json()
        assert job["outcome"] == "compile_error", job
        until(visit.page, "document.querySelectorAll('#attempt-rows tr').length === 1", timeout_s=60)
        assert len(failed) == 2, failed
    visit.errors[:] = [error for error in visit.errors if "502" not in error]  # the console's note of the 502s


def test_pages_read_without_javascript_by_keyboard_and_on_a_narrow_screen(browser, seeded) -> None:
    service, run = seeded
    plain = Visit(browser, service, width=360, javascript=False)
    try:
        plain.log_in(f"/runs/{run['id']}")
        assert plain.page.locator("#attempt-rows tr").count() == run["attempts"]  # rendered by the server
        overflow = plain.page.evaluate("() => document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"the page is {overflow} px wider than a 360 px screen"
        plain.page.keyboard.press("Tab")
        assert plain.page.evaluate("() => document.activeElement.className") == "skip"
        plain.page.keyboard.press("Enter")
        assert plain.page.evaluate("() => location.hash") == "#main"
    finally:
        plain.close()
    assert not plain.errors, plain.errors


def test_without_the_token_a_page_sends_the_browser_to_the_login_form(seeded) -> None:
    service, run = seeded
    answer = httpx.get(f"{service.url}/runs/{run['id']}", follow_redirects=False)
    assert answer.status_code == 303 and answer.headers["location"] == f"/login?next=/runs/{run['id']}"
    wrong = httpx.post(f"{service.url}/login", data={"token": "not-it", "next": "/"}, follow_redirects=False)
    assert wrong.status_code == 401 and "is not this service" in wrong.text
    outside = httpx.post(
        f"{service.url}/login", data={"token": TOKEN, "next": "//evil.example/"}, follow_redirects=False
    )
    assert outside.status_code == 303 and outside.headers["location"] == "/"
    live = httpx.get(f"{service.url}/runs/{run['id']}/live", follow_redirects=False)
    assert live.status_code == 303  # the polled data needs the token too
    cookie_only = httpx.get(f"{service.url}/v1/runs", cookies={"kernelloop_token": TOKEN})
    assert cookie_only.status_code == 401  # the cookie opens the pages, never the API


def _seconds(shown: str) -> int:
    """A duration as the page prints it ("42 s", "3 min 05 s", "1 h 02 min") in seconds."""
    units = {"h": 3600, "min": 60, "s": 1}
    return sum(int(n) * units[unit] for n, unit in re.findall(r"(\d+) (h|min|s)\b", shown))


def test_the_live_run_page_shows_the_best_speedup_and_duration_of_an_attempt_that_lands(visit: Visit, seeded) -> None:
    service, _ = seeded
    page = visit.page
    with service.client() as api:
        run = api.post("/v1/runs", json={"problem": PROBLEM, "proposer": "human", "name": "best-live"}).json()
        started = time.monotonic()
        visit.log_in(f"/runs/{run['id']}")
        until(page, "window.kernelloopChart !== undefined")
        assert page.locator("#run-best").inner_text() == "–"
        job = api.post("/v1/evaluate", json=submission(python_conv(), run_id=run["id"], options=COUNTED_EVAL)).json()
        assert job["outcome"] == "passed", job
        landed = api.get(f"/v1/runs/{run['id']}").json()
    elapsed = time.monotonic() - started
    assert landed["best_speedup"] and landed["best_attempt_id"] == job["attempt_id"], landed
    until(page, "document.querySelector('#run-best').innerText !== '–'")
    assert page.locator("#run-best").inner_text() == f"{landed['best_speedup']:.2f}x"
    assert page.locator("#run-best a").get_attribute("href") == f"/attempts/{job['attempt_id']}"
    until(page, f"document.querySelector('#run-duration').innerText.match(/\\d+ s/) && {elapsed - 2}")
    assert _seconds(page.locator("#run-duration").inner_text()) >= int(elapsed) - 2  # the run has lasted that long


def test_on_a_phone_the_attempts_speedup_column_is_in_view(browser, seeded) -> None:
    service, run = seeded
    narrow = Visit(browser, service, width=375)
    try:
        narrow.log_in(f"/runs/{run['id']}")
        heading = narrow.page.locator("#attempts thead th", has_text="Speedup")
        cell = narrow.page.locator("#attempt-rows tr td.num").first
        for element in (heading, cell):
            box = element.bounding_box()
            assert box is not None and 0 <= box["x"] and box["x"] + box["width"] <= 375, box
        assert "x" in cell.inner_text() or cell.inner_text() == "–"
    finally:
        narrow.close()
    assert not narrow.errors, narrow.errors
