"""What each page shows, read from the history: the models the templates render and the run page polls.

The pages read through the same storage functions as the JSON API, so a page never shows what the API
would not; these models only arrange it for people (a run's steps for the plot, a listing's lines with the
diagnostics that point at them, a benchmark's shapes as table rows).
"""

from __future__ import annotations

from typing import TypeVar

from markupsafe import Markup
from pydantic import BaseModel, ConfigDict, Field
from sqlmodel import Session

from kernelloop.contract import (
    AttemptDetail,
    AttemptDiff,
    AttemptFilter,
    AttemptSummary,
    LeaderboardEntry,
    ProblemSummary,
    RunPublic,
    RunStatus,
    StepProgress,
    utcnow,
)
from kernelloop.server.web.highlight import highlighted_lines
from kernelloop.storage import history, problems, queue
from kernelloop.tools.results import (
    BenchmarkResult,
    Diagnostic,
    ProfileResult,
    ShapeBenchmark,
    ShapeCheck,
    TestResult,
    compile_part,
)

LEADERBOARD_DEPTH = 3
RUN_ATTEMPTS_SHOWN = 500
FAILED_CHECKS_SHOWN = 10


class ProblemRow(BaseModel):
    problem: ProblemSummary
    leaders: list[LeaderboardEntry]


class ChartStep(BaseModel):
    """One attempt of a run, a point of its plot: x is its place in the run (1 = the first attempt)."""

    x: int
    attempt_id: int
    status: str
    speedup: float | None
    shapes: dict[str, float | None]


class RunChart(BaseModel):
    shapes: list[str]
    steps: list[ChartStep]


class UnderWay(BaseModel):
    """A queued or running job of the run, and where it is."""

    job_id: int
    attempt_id: int
    status: str
    queue_position: int | None
    current: StepProgress | None


class RunLive(BaseModel):
    """What the run page polls while the run is running."""

    status: str
    attempts: int
    best_speedup: float | None
    best_html: str = Field(description="the page's Best speedup, rendered: the figure linked to its attempt")
    duration: str = Field(description="the page's Duration, rendered (the run's time so far while it runs)")
    chart: RunChart
    under_way: list[UnderWay]
    rows_html: str


class RunView(BaseModel):
    run: RunPublic
    attempts: list[AttemptSummary]
    chart: RunChart
    under_way: list[UnderWay]
    duration_s: float


class CodeLine(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)

    number: int
    html: Markup
    diagnostics: list[Diagnostic]


class AttemptView(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)

    attempt: AttemptDetail
    lines: list[CodeLine]
    unplaced: list[Diagnostic]
    timing: list[ShapeBenchmark]
    timing_method: str
    failed_checks: list[ShapeCheck]
    profile: ProfileResult | None = None
    """the last profile that read kernels (its summary and one row per kernel)"""
    diff: AttemptDiff | None
    diff_error: str | None


def problem_rows(session: Session) -> list[ProblemRow]:
    return [
        ProblemRow(
            problem=problems.summary(row),
            leaders=history.leaderboard(session, problem_id=row.id, limit=LEADERBOARD_DEPTH),
        )
        for row in problems.all_problems(session)
    ]


def run_view(session: Session, run: RunPublic) -> RunView:
    attempts = history.list_attempts(
        session, AttemptFilter(run_id=run.id, sort="id", order="asc", limit=RUN_ATTEMPTS_SHOWN)
    ).items
    end = run.finished_at or (utcnow() if run.status == RunStatus.active else run.updated_at or run.created_at)
    return RunView(
        run=run,
        attempts=attempts,
        chart=run_chart(session, attempts),
        under_way=under_way(session, run.id),
        duration_s=max(0.0, (end - run.created_at).total_seconds()),
    )


def run_chart(session: Session, attempts: list[AttemptSummary]) -> RunChart:
    """Speedup over the run's steps: the geometric mean and each benchmark shape's; an attempt with no
    timing keeps its place with its status (the plot marks it as a failure of that kind)."""
    benchmarks = history.latest_benchmarks(session, [a.id for a in attempts])
    shapes = sorted({s.shape for b in benchmarks.values() for s in b.shapes})
    steps = []
    for x, attempt in enumerate(attempts, start=1):
        timed = benchmarks.get(attempt.id)
        per_shape = {s.shape: s.speedup for s in timed.shapes} if timed else {}
        steps.append(
            ChartStep(
                x=x,
                attempt_id=attempt.id,
                status=_status(attempt),
                speedup=attempt.speedup,
                shapes={name: per_shape.get(name) for name in shapes},
            )
        )
    return RunChart(shapes=shapes, steps=steps)


def _status(attempt: AttemptSummary) -> str:
    if attempt.status.value == "passed" and attempt.speedup is None:
        return "passed, not timed"
    return str(attempt.status.value)


def under_way(session: Session, run_id: int) -> list[UnderWay]:
    jobs = [queue.job_public(session, job) for job in queue.open_jobs_of_run(session, run_id)]
    return [
        UnderWay(
            job_id=job.id,
            attempt_id=job.attempt_id,
            status=job.status.value,
            queue_position=job.queue_position,
            current=job.current,
        )
        for job in jobs
    ]


def attempt_view(session: Session, detail: AttemptDetail, against: int | None) -> AttemptView:
    diagnostics = _diagnostics(detail)
    by_line: dict[int, list[Diagnostic]] = {}
    for diagnostic in diagnostics:
        if diagnostic.line is not None:
            by_line.setdefault(diagnostic.line, []).append(diagnostic)
    highlighted = highlighted_lines(detail.code)
    lines = [
        CodeLine(number=i, html=html, diagnostics=by_line.get(i, [])) for i, html in enumerate(highlighted, start=1)
    ]
    unplaced = [d for d in diagnostics if d.line is None or d.line > len(lines)]
    benchmark = _last(detail, BenchmarkResult)
    test = _last(detail, TestResult)
    base = against if against is not None else detail.parent_id
    diff = history.diff_attempts(session, base, detail.id) if base is not None else None
    diff_error = f"there is no attempt {base} to compare with" if base is not None and diff is None else None
    return AttemptView(
        attempt=detail,
        lines=lines,
        unplaced=unplaced,
        timing=benchmark.shapes if benchmark else [],
        timing_method=benchmark.timing_method if benchmark else "",
        failed_checks=[c for c in test.checks if c.status.value != "passed"][:FAILED_CHECKS_SHOWN] if test else [],
        profile=_last(detail, ProfileResult),
        diff=diff,
        diff_error=diff_error,
    )


def _diagnostics(detail: AttemptDetail) -> list[Diagnostic]:
    """The diagnostics of the attempt's builds, each once (a test repeats its compile's)."""
    seen: dict[tuple[object, ...], Diagnostic] = {}
    for evaluation in detail.evaluations:
        built = compile_part(evaluation.result)
        for d in built.diagnostics if built else []:
            seen.setdefault((d.severity, d.line, d.column, d.message), d)
    return list(seen.values())


R = TypeVar("R", BenchmarkResult, TestResult, ProfileResult)


def _last(detail: AttemptDetail, kind: type[R]) -> R | None:
    for evaluation in reversed(detail.evaluations):
        if isinstance(evaluation.result, kind):
            return evaluation.result
    return None
