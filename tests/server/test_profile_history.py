"""A profile stored with its attempt: the history's API serves it back whole, the attempt page shows a row per
kernel and the summary, and it leaves the attempt's correctness and speedup as they were.

The profile is the judge's real parse of Nsight Compute's output captured on the H200 (no GPU here), recorded
into a running service's database as the scheduler records a step.
"""

from __future__ import annotations

import html
from collections.abc import Iterator

import httpx
import pytest
from profile_fixtures import PROFILED_PROBLEM, captured_profile
from server_fixtures import ServiceProcess, passed_benchmark, passed_test
from sqlmodel import Session

from kernelloop.storage import history, problems
from kernelloop.storage.database import database_url, open_database
from kernelloop.storage.models import Attempt, utcnow
from kernelloop.tools.results import CompileResult, PhaseResult, ProfileResult, Status


@pytest.fixture(scope="module")
def service() -> Iterator[ServiceProcess]:
    with ServiceProcess("profile-history") as svc:
        yield svc


@pytest.fixture(scope="module")
def api(service: ServiceProcess) -> Iterator[httpx.Client]:
    with service.client() as client:
        yield client


def _attempt_with(service: ServiceProcess, verdicts: list[PhaseResult]) -> int:
    """A new attempt on the cuda backend with these verdicts recorded in order, as the scheduler records steps."""
    engine = open_database(database_url(str(service.db)), create=False)
    try:
        with Session(engine) as session:
            problem = problems.get_problem(session, PROFILED_PROBLEM)
            code = history.store_code(session, f"# profiled attempt {len(verdicts)} {utcnow()}\n")
            attempt = Attempt(problem_id=problem.id, backend="cuda", code_sha256=code, proposer="human")
            session.add(attempt)
            session.flush()
            assert attempt.id is not None
            now = utcnow()
            for verdict in verdicts:
                history.record_evaluation(
                    session, attempt.id, None, verdict, created_at=now, started_at=now, finished_at=now
                )
            return attempt.id
    finally:
        engine.dispose()


def test_a_profile_is_served_back_whole_and_shown_per_kernel(service: ServiceProcess, api: httpx.Client) -> None:
    compiled = CompileResult(status=Status.passed, problem=PROFILED_PROBLEM, backend="cuda")
    profile = captured_profile(judge_ms=0.5)
    profile.compile = compiled
    assert profile.kernels, profile.message
    attempt_id = _attempt_with(service, [profile])

    detail = api.get(f"/v1/attempts/{attempt_id}").json()
    (evaluation,) = detail["evaluations"]
    assert evaluation["kind"] == "profile" and evaluation["status"] == "passed"
    assert ProfileResult.model_validate(evaluation["result"]) == profile

    page = html.unescape(api.get(f"/attempts/{attempt_id}").text)
    table = page[page.index('<table id="profile">') :]
    table = table[: table.index("</table>")]
    assert f"on shape {profile.shape}" in table
    for kernel in profile.kernels:
        assert f'<th scope="row" class="message">{kernel.name}</th>' in table
        assert f"{kernel.duration_us:.1f}" in table
    assert profile.summary.splitlines()[0] in page
    for warning in profile.warnings:
        assert warning in page


def test_a_profile_after_a_benchmark_keeps_the_attempts_correctness_and_speedup(
    service: ServiceProcess, api: httpx.Client
) -> None:
    compiled = CompileResult(status=Status.passed, problem=PROFILED_PROBLEM, backend="cuda")
    profile = captured_profile()
    attempt_id = _attempt_with(
        service, [passed_test(backend="cuda", compile=compiled), passed_benchmark(1.7, backend="cuda"), profile]
    )

    summary = api.get(f"/v1/attempts/{attempt_id}").json()
    assert summary["correct"] is True and summary["speedup"] == pytest.approx(1.7)
    assert [e["kind"] for e in summary["evaluations"]] == ["test", "benchmark", "profile"]
