"""The run page and the compare page in Chromium, as a person reads them: the best so far as a step line over the
steps' points, the interval as a band, the host's load beside it with a loaded timing ringed and not ranked, a legend
that shows each line's values without hovering, the run's settings and version, two runs ticked on the runs list and
overlaid, and the best kernel downloaded as a .py file.

The history is written straight into the service's database (tests/run_history.py): two runs of drawn speedups,
spreads and host loads, nothing built or timed, so every figure the pages show is known here. Their screenshots land
in the test's folder, or in docs/screenshots/ with KERNELLOOP_UPDATE_SCREENSHOTS=1 (the README shows them).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import browser_fixtures
import httpx
import pytest
from browser_fixtures import Visit, screenshot_folder, until
from run_history import PROBLEM, add_compile_error, add_timed_step, best_so_far, new_run, timed_benchmark
from server_fixtures import ServiceProcess
from sqlmodel import Session

from kernelloop.server.provenance import service_provenance
from kernelloop.storage.database import database_url, open_database

pytestmark = pytest.mark.scenario  # a browser against a service: `make test` runs it, `make test-fast` does not
browser, visit = browser_fixtures.browser, browser_fixtures.visit  # the fixtures: Chromium, a logged-in page

HOSTILE_NAME = '<img src=x id=injected> "run" & co'
STEPS = 9
BROKEN_STEP = 4


@dataclass
class SeededRun:
    id: int
    name: str
    seed: int
    speedups: list[float | None] = field(default_factory=list)
    loads: list[float | None] = field(default_factory=list)
    loaded: int | None = None
    codes: dict[int, str] = field(default_factory=dict)
    """each timed step's attempt id and its code"""

    attempt_ids: list[int] = field(default_factory=list)
    best: list[tuple[int, float] | None] = field(default_factory=list)
    """after each step, the run's best by the rule (tests/run_history.best_so_far)"""

    def geomean(self) -> list[float | None]:
        """Each step's stated speedup: its timing, none where that was taken on a loaded host (never counted)."""
        return [None if step == self.loaded else s for step, s in enumerate(self.speedups, start=1)]

    def best_so_far(self) -> list[float | None]:
        return [b[1] if b else None for b in self.best]


def _seed_run(session: Session, rng: random.Random, name: str, loaded: int | None) -> SeededRun:
    seed = rng.randrange(1, 1_000_000)
    config = {"seed": seed, "search_time_budget_s": rng.choice([0.25, 0.5, 1.0]), "iterations": STEPS}
    run = SeededRun(id=new_run(session, name, config), name=name, seed=seed, loaded=loaded)
    level = rng.uniform(0.3, 0.6)
    for step in range(1, STEPS + 1):
        code = f"# {name}, step {step}: {rng.random()}\n"
        if step == BROKEN_STEP:
            run.attempt_ids.append(add_compile_error(session, run.id, code))
            run.speedups.append(None)
            run.loads.append(None)
            continue
        level *= rng.uniform(0.85, 1.35)
        speedup = level * 3 if step == loaded else level  # the loaded timing is the luckiest: it must not rank
        load = rng.uniform(3.0, 4.0) if step == loaded else rng.uniform(1.0, 1.8)
        benchmark = timed_benchmark(rng, speedup, n=rng.randint(5, 40), host_slowdown=load, loaded=step == loaded)
        attempt_id = add_timed_step(session, run.id, code, benchmark)
        run.codes[attempt_id] = code
        run.attempt_ids.append(attempt_id)
        run.speedups.append(speedup)
        run.loads.append(load)
    run.best = best_so_far(session, run.id)
    return run


@pytest.fixture(scope="module")
def seeded() -> Iterator[tuple[ServiceProcess, list[SeededRun]]]:
    rng = random.Random(random.getrandbits(64))  # the module's draws, from the run's seed (conftest)
    with ServiceProcess("run-page") as service:
        engine = open_database(database_url(str(service.db)), create=False)
        with Session(engine) as session:
            runs = [
                _seed_run(session, rng, "quiet host", loaded=None),
                _seed_run(
                    session, rng, HOSTILE_NAME, loaded=rng.choice([s for s in range(2, STEPS) if s != BROKEN_STEP])
                ),
            ]
        engine.dispose()
        yield service, runs


def _series(page, plot: str = "plot") -> dict[str, list]:
    """The plot's data by its series' labels, as uPlot holds it."""
    return page.evaluate(
        f"""() => {{
            const plot = window.kernelloopChart.{plot};
            return Object.fromEntries(plot.series.map((s, i) => [s.label, plot.data[i]]));
        }}"""
    )


def _legend(page, name: str) -> str:
    return page.locator(f"#chart-legend li[data-series='{name}']").inner_text()


def test_the_best_so_far_is_a_step_line_that_ignores_the_loaded_timing(visit: Visit, seeded, tmp_path: Path) -> None:
    service, (_, run) = seeded
    visit.log_in(f"/runs/{run.id}")
    page = visit.page
    until(page, "window.kernelloopChart !== undefined")
    series = _series(page)
    assert series["step"] == list(range(1, STEPS + 1))
    assert series["geomean speedup"] == pytest.approx(run.geomean())
    assert series["best so far"] == pytest.approx(run.best_so_far())
    assert max(s for s in run.speedups if s is not None) > run.best_so_far()[-1]  # the loaded one stayed out
    ringed = series["loaded host, not ranked"]
    assert [i + 1 for i, v in enumerate(ringed) if v is not None] == [run.loaded]
    assert series["compile_error"][BROKEN_STEP - 1] == 0
    assert run.best[-1] is not None
    best_id, best = run.best[-1]
    best_step = run.attempt_ids.index(best_id) + 1
    assert _legend(page, "best so far").startswith(f"best so far {best:.2f}x (step {best_step}, attempt ")
    assert f"1 step ({run.loaded})" in _legend(page, "loaded host")
    best_attempt = page.locator("#chart-legend li[data-series='best so far'] a").get_attribute("href")
    assert page.locator("#run-best").inner_text() == f"{best:.2f}x"  # the page's best is the ranked one
    assert page.locator("#run-best a").get_attribute("href") == best_attempt
    assert page.locator("#run-download a").get_attribute("href") == f"{best_attempt}/source.py"
    assert best_attempt == f"/attempts/{best_id}"
    with service.client() as api:  # the runs list states the same best
        assert api.get(f"/v1/runs/{run.id}").json()["best_attempt_id"] == best_id
    assert page.locator("#attempt-rows tr").count() == STEPS  # the table's Step column is the plot's x
    assert page.locator("#attempt-rows tr td:first-child").all_inner_texts() == [str(s) for s in range(1, STEPS + 1)]
    marked = page.locator("#attempt-rows tr:has(.tag) td:first-child").all_inner_texts()
    assert marked == [str(run.loaded)]  # the table marks the loaded timing as the plot rings it
    shot = screenshot_folder(tmp_path) / "run-page.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000


def test_the_band_spans_each_timed_steps_interval_and_the_legend_shows_the_values(visit: Visit, seeded) -> None:
    _, (run, _) = seeded
    visit.log_in(f"/runs/{run.id}")
    page = visit.page
    until(page, "window.kernelloopChart !== undefined")
    series = _series(page)
    assert page.evaluate("() => window.kernelloopChart.plot.bands.map(b => b.series)") == [[3, 4]]
    for speedup, low, high in zip(
        series["geomean speedup"], series["interval low"], series["interval high"], strict=True
    ):
        if speedup is None:
            assert low is None and high is None
        else:
            assert low < speedup < high
    last = STEPS - 1
    assert _legend(page, "interval") == (
        f"interval {series['interval low'][last]:.2f}x to {series['interval high'][last]:.2f}x at step {STEPS}"
    )
    assert _legend(page, "geomean speedup") == f"geomean speedup latest {run.speedups[-1]:.2f}x (step {STEPS})"
    shape_items = page.locator("#chart-legend li").all_inner_texts()
    shapes = [name for name in series if name.startswith("cpu_")]
    assert shapes and all(any(item.startswith(f"{name} latest ") for item in shape_items) for name in shapes)


def test_the_host_load_is_plotted_beside_the_speedup(visit: Visit, seeded) -> None:
    _, (_, run) = seeded
    visit.log_in(f"/runs/{run.id}")
    page = visit.page
    until(page, "window.kernelloopChart !== undefined")
    assert page.locator("#load-chart canvas").count() == 1
    load = _series(page, "load")
    assert load["host slowdown"] == pytest.approx(run.loads)
    worst = max(v for v in run.loads if v is not None)
    assert _legend(page, "host slowdown") == f"host slowdown worst {worst:.2f}x"


def test_the_settings_and_the_version_are_on_the_run_page(visit: Visit, seeded) -> None:
    _, (run, _) = seeded
    version, commit = service_provenance()
    visit.log_in(f"/runs/{run.id}")
    page = visit.page
    assert page.locator("#run-version").inner_text() == f"kernelloop {version}"
    assert page.locator("#run-commit").inner_text() == commit
    settings = dict(
        zip(page.locator("#run-settings dt").all_inner_texts(), page.locator("#run-settings dd").all_inner_texts())
    )
    assert settings["seed"] == str(run.seed) and settings["iterations"] == str(STEPS), settings


def test_two_runs_ticked_on_the_runs_list_are_compared_overlaid(visit: Visit, seeded, tmp_path: Path) -> None:
    _, runs = seeded
    visit.log_in("/runs")
    page = visit.page
    for run in runs:
        page.check(f"#compare-{run.id}")
    page.click("#compare-form button[type=submit]")
    page.wait_for_load_state("load")
    assert page.url == f"{visit.base}/compare?runs={runs[1].id}&runs={runs[0].id}", page.url  # as listed: newest first
    until(page, "window.kernelloopCompare !== undefined")
    plotted = page.evaluate("() => window.kernelloopCompare.plot.series.map(s => s.label)")
    labels = [f"run {run.id} · {run.name}" for run in runs]  # oldest first
    lines = ("speedup", "best so far", "loaded host, not ranked")
    assert plotted == ["step"] + [f"{label}: {line}" for label in labels for line in lines]
    data = page.evaluate("() => window.kernelloopCompare.plot.data")
    for i, run in enumerate(runs):
        speedup, best, loaded = data[1 + 3 * i : 4 + 3 * i]
        assert speedup == pytest.approx(run.geomean()) and best == pytest.approx(run.best_so_far())
        assert [step for step, v in enumerate(loaded, start=1) if v is not None] == ([run.loaded] if run.loaded else [])
    legend = page.locator("#compare-legend li").all_inner_texts()
    for run, label, item in zip(runs, labels, legend, strict=True):
        assert item.startswith(f"{label} best so far {run.best_so_far()[-1]:.2f}x"), item
    assert page.locator("#injected").count() == 0  # the run's name is text, never markup
    differs = page.locator("#compared-settings tr.differs th").all_inner_texts()
    assert any(name.startswith("seed") for name in differs), differs
    assert not any(name.startswith("commit") for name in differs)  # one checkout made both
    shot = screenshot_folder(tmp_path) / "compare.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000


def test_the_best_kernel_downloads_as_a_python_file(visit: Visit, seeded, tmp_path: Path) -> None:
    service, (run, _) = seeded
    with service.client() as api:
        best_id = api.get(f"/v1/runs/{run.id}").json()["best_attempt_id"]
    visit.log_in(f"/runs/{run.id}")
    with visit.page.expect_download() as download:
        visit.page.click("#run-download a")
    saved = tmp_path / "downloaded.py"
    download.value.save_as(saved)
    assert download.value.suggested_filename == f"{PROBLEM}-attempt-{best_id}.py"
    assert saved.read_text() == run.codes[best_id]


def test_a_running_runs_legend_and_download_follow_each_new_step(visit: Visit, seeded) -> None:
    service, _ = seeded
    rng = random.Random(random.getrandbits(64))
    engine = open_database(database_url(str(service.db)), create=False)
    with Session(engine) as session:
        run_id = new_run(session, "live", {})
        visit.log_in(f"/runs/{run_id}")
        until(visit.page, "window.kernelloopChart !== undefined")
        assert _legend(visit.page, "best so far") == "best so far –" and visit.page.locator("#load-chart").is_hidden()
        speedups = [rng.uniform(0.5, 2.0) for _ in range(2)]
        for step, speedup in enumerate(speedups, start=1):
            add_timed_step(session, run_id, f"# live {step}\n", timed_benchmark(rng, speedup))
            until(visit.page, f"window.kernelloopChart.steps.length === {step}")
            ruled = best_so_far(session, run_id)[-1]
            assert ruled is not None
            best_id, best = ruled
            until(visit.page, f"document.querySelector('#run-best').innerText === '{best:.2f}x'")
            assert _legend(visit.page, "best so far").startswith(f"best so far {best:.2f}x (step ")
            assert visit.page.locator("#run-download a").get_attribute("href") == f"/attempts/{best_id}/source.py"
        assert visit.page.locator("#load-chart").is_visible()
    engine.dispose()


def test_the_download_needs_the_token_and_says_what_it_is(seeded) -> None:
    service, (run, _) = seeded
    attempt_id = next(iter(run.codes))
    outside = httpx.get(f"{service.url}/attempts/{attempt_id}/source.py", follow_redirects=False)
    assert outside.status_code == 303 and outside.headers["location"] == f"/login?next=/attempts/{attempt_id}/source.py"
    with service.client() as pages:
        answer = pages.get(f"/attempts/{attempt_id}/source.py")
        assert answer.status_code == 200 and answer.text == run.codes[attempt_id]
        assert answer.headers["content-type"] == "text/x-python; charset=utf-8"
        assert answer.headers["content-disposition"] == f'attachment; filename="{PROBLEM}-attempt-{attempt_id}.py"'
        assert (
            f'<a id="code-download" href="/attempts/{attempt_id}/source.py" download>'
            in pages.get(f"/attempts/{attempt_id}").text
        )  # the attempt page links its file too
        missing = pages.get("/attempts/999999/source.py")
        assert missing.status_code == 404 and "There is no attempt 999999" in missing.text


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("", "0 distinct runs chosen; a comparison takes 2 to 8"),
        ("runs=RUN", "1 distinct run chosen"),
        ("runs=RUN&runs=RUN", "1 distinct run chosen"),
        ("runs=RUN&runs=abc", "'abc' is not a run id"),
        ("runs=RUN&runs=999999", "there is no run 999999"),
    ],
)
def test_a_comparison_of_fewer_than_two_runs_or_of_unknown_ones_says_what_to_choose(
    seeded, query: str, says: str
) -> None:
    service, (run, _) = seeded
    with service.client() as pages:
        answer = pages.get(f"/compare?{query.replace('RUN', str(run.id))}")
    assert answer.status_code == 400 and says in answer.text.replace("&#39;", "'"), answer.text
    assert "runs page" in answer.text


def test_a_comparison_ignores_query_parameters_it_does_not_read(seeded) -> None:
    service, runs = seeded
    with service.client() as pages:
        answer = pages.get("/compare", params={"runs": [run.id for run in runs], "utm_source": "newsletter"})
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/html"), answer.text[:300]
    assert all(f'<li data-run="{run.id}">' in answer.text for run in runs)
