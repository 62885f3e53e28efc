"""One meaning of step: the agent's proposal number within its run. The table `kernelloop agent run` prints, the
run page's Step column and plot, the API's attempt and job, and each measurement agree on it, re-times included."""

from __future__ import annotations

import io
import random
import re
from pathlib import Path

from server_fixtures import measured_benchmark
from sqlmodel import Session

from kernelloop.agent.models import Outcome, Proposal, RunSummary
from kernelloop.agent.progress import Progress
from kernelloop.agent.run_record import RunRecord
from kernelloop.contract import AttemptFilter, RunCreate, SubmissionRequest, utcnow
from kernelloop.server.web import pages, run_series
from kernelloop.storage import history, problems, queue
from kernelloop.storage.database import database_url, open_database
from kernelloop.tools.jobs import EvalOptions

PROBLEM = "causal_conv1d"


def test_the_command_lines_step_is_the_pages_and_every_measurements(tmp_path: Path) -> None:
    engine = open_database(database_url(str(tmp_path / "kl.sqlite3")))
    codes = ["# baseline", "# blocked", "# baseline", "# vectorized", "# blocked"]  # steps 3 and 5 re-time
    record = RunRecord()
    with Session(engine) as session:
        problems.sync_shipped(session)
        problem = problems.get_problem(session, PROBLEM)
        assert problem is not None
        run = history.create_run(session, problem, RunCreate(problem=PROBLEM))
        for step, code in enumerate(codes, start=1):  # as the agent's Submitter sends each step's proposal
            request = SubmissionRequest(problem=PROBLEM, code=code, run_id=run.id, step=step)
            attempt, _ = history.create_attempt(session, problem, request, "cpu", "agent")
            job = queue.enqueue(session, attempt, "benchmark", EvalOptions(), "agent", run_step=request.step)
            now = utcnow()
            speedup = random.uniform(0.5, 2.0)
            assert attempt.id is not None and job.id is not None
            history.record_evaluation(
                session,
                attempt.id,
                job.id,
                measured_benchmark(speedup),
                created_at=now,
                started_at=now,
                finished_at=now,
            )
            outcome = Outcome(
                step=step, trajectory=0, tool="benchmark", attempt_id=attempt.id, status="passed", speedup=speedup
            )
            record.add(0, Proposal(code=code), outcome)
        attempts = history.list_attempts(session, AttemptFilter(run_id=run.id, sort="id", order="asc")).items
        chart = run_series.run_chart(session, attempts)
        measured = {a.id: [m.step for m in history.measurements(session, a.id)] for a in attempts}
    engine.dispose()

    stream = io.StringIO()
    summary = RunSummary(
        run_id=1, problem=PROBLEM, backend="cpu", proposer="search", status="finished", reason="", steps=5,
        attempts=record.lines,
    )  # fmt: skip
    Progress(stream).summary(summary)
    printed = [line.split()[:3] for line in stream.getvalue().splitlines() if re.match(r"^\s+\d+\s+\d+\s+\d+", line)]
    cli_steps: dict[int, list[int]] = {}
    for step, _trajectory, attempt_id in printed:
        cli_steps.setdefault(int(attempt_id), []).append(int(step))

    macros = pages.templates.env.get_template("_macros.html").module
    rows = re.findall(
        r"<tr>\s*<td>([^<]*)</td>\s*<td><a href=\"/attempts/(\d+)\">", str(macros.attempt_rows(attempts, chart))
    )
    page_steps = {int(attempt_id): int(step) for step, attempt_id in rows}
    plotted = {point.attempt_id: point.x for point in chart.steps}

    assert sorted(step for steps in cli_steps.values() for step in steps) == [1, 2, 3, 4, 5]
    assert len(attempts) == 3  # three kernels: the re-times are measurements of the attempts they re-timed
    for attempt in attempts:
        first = min(cli_steps[attempt.id])
        assert attempt.step == page_steps[attempt.id] == plotted[attempt.id] == first
        assert measured[attempt.id] == cli_steps[attempt.id]  # each measurement names the step that took it
