"""The pages' fields over plain HTTP: the run page's poll carries every field the page shows (Best
speedup and Duration went stale), the attempt page's Verdicts name their phase and what they computed in, the
problems page reads its tolerance as words, and the live JSON of an unknown run is a 404 that says so.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from server_fixtures import REPO, ServiceProcess, passed_benchmark, passed_test
from sqlmodel import Session

from kernelloop.contract import RunCreate
from kernelloop.storage import history, problems
from kernelloop.storage.database import database_url, open_database
from kernelloop.storage.models import Attempt, utcnow
from kernelloop.tools.results import CompileResult, Status

RUN_JS = REPO / "server" / "web" / "static" / "run.js"


@pytest.fixture(scope="module")
def service() -> Iterator[ServiceProcess]:
    with ServiceProcess("page-fields") as svc:
        yield svc


@pytest.fixture(scope="module")
def pages(service: ServiceProcess) -> Iterator[httpx.Client]:
    with service.client() as client:  # the bearer header opens the pages as the login cookie does
        yield client


def _new_run(db: Path) -> int:
    engine = open_database(database_url(str(db)), create=False)
    with Session(engine) as session:
        problem = problems.get_problem(session, "causal_conv1d")
        run_id = history.create_run(session, problem, RunCreate(problem="causal_conv1d", name="fields")).id
    engine.dispose()
    assert run_id is not None
    return run_id


def _add_timed_attempt(db: Path, run_id: int, speedup: float, dtype: str | None = None) -> int:
    """An attempt of the run that passed its test and was timed at `speedup` (computed in `dtype`), written into
    the service's database."""
    engine = open_database(database_url(str(db)), create=False)
    with Session(engine) as session:
        problem = problems.get_problem(session, "causal_conv1d")
        sha = history.store_code(session, f"# fields attempt {speedup}\n")
        attempt = Attempt(
            problem_id=problem.id, run_id=run_id, backend="cpu", code_sha256=sha, step=0, proposer="human"
        )
        session.add(attempt)
        session.flush()
        attempt_id = attempt.id
        assert attempt_id is not None
        now = utcnow()
        compiled = CompileResult(status=Status.passed, problem="causal_conv1d", backend="cpu")
        for verdict in (passed_test(compile=compiled), passed_benchmark(speedup)):
            verdict.dtype = dtype
            history.record_evaluation(
                session, attempt_id, None, verdict, created_at=now, started_at=now, finished_at=now
            )
    engine.dispose()
    return attempt_id


def test_the_live_poll_carries_best_speedup_and_duration(service: ServiceProcess, pages: httpx.Client) -> None:
    run_id = _new_run(service.db)
    before = pages.get(f"/runs/{run_id}/live").json()
    assert before["status"] == "active" and before["best_html"] == "–" and re.fullmatch(r"\d+ s", before["duration"])
    attempt_id = _add_timed_attempt(service.db, run_id, 0.84)
    after = pages.get(f"/runs/{run_id}/live").json()
    assert after["best_speedup"] == pytest.approx(0.84)
    assert after["best_html"] == f'<a href="/attempts/{attempt_id}">0.84x</a>', after["best_html"]
    # the page holds the same fields, in the elements the poll's script rewrites
    page = pages.get(f"/runs/{run_id}").text
    assert f'<dd id="run-best">{after["best_html"]}</dd>' in page
    assert re.search(r'<dd id="run-duration">\d+ s</dd>', page), page
    script = RUN_JS.read_text()
    assert 'getElementById("run-best").innerHTML = live.best_html' in script
    assert 'getElementById("run-duration").textContent = live.duration' in script


def test_the_attempt_page_names_each_verdicts_phase_and_dtype(service: ServiceProcess, pages: httpx.Client) -> None:
    """A verdict of a job cast by KernelBench's precision option says what it computed in."""
    attempt_id = _add_timed_attempt(service.db, _new_run(service.db), 1.5, dtype="bfloat16")
    page = pages.get(f"/attempts/{attempt_id}").text
    table = page[page.index('<table id="evaluations">') :]
    table = table[: table.index("</table>")]
    phases = re.findall(r"<tr><td>([^<]*)</td>", table)
    assert phases and set(phases) <= {"compile", "test", "benchmark"} and "benchmark" in phases, phases
    header = re.findall(r"<th[^>]*>([^<]*)</th>", table)
    column = header.index("Computed in")
    rows = [re.findall(r"<td[^>]*>(.*?)</td>", row, flags=re.S) for row in re.findall(r"<tr><td>.*?</tr>", table, re.S)]
    assert {row[column] for row in rows} == {"bfloat16"}, rows


def test_the_problems_page_reads_the_tolerance_as_words(pages: httpx.Client) -> None:
    page = html.unescape(pages.get("/").text)
    assert "max_rel_error=" not in page and "allow_tf32=" not in page
    assert "tf32: relative error ≤ 0.002 of max|truth|, TF32 allowed" in page


def test_an_unknown_runs_live_json_is_a_404_that_says_so(pages: httpx.Client) -> None:
    answer = pages.get("/runs/999999/live")
    assert answer.status_code == 404 and answer.headers["content-type"] == "application/json", answer.headers
    body = answer.json()
    assert body["error"] == "unknown_run" and "999999" in body["message"] and body["field"] == "path.run_id", body


def test_every_status_a_verdict_can_have_has_its_colour_on_the_pages() -> None:
    """A verdict's badge without a rule reads as plain text among coloured ones (memory_error had none)."""
    stylesheet = (REPO / "server" / "web" / "static" / "kernelloop.css").read_text()
    uncoloured = [status.value for status in Status if f".status-{status.value}" not in stylesheet]
    assert not uncoloured, uncoloured
