"""What each page shows, read from the history: the models the templates render and the run page polls.

The pages read through the same storage functions as the JSON API, so a page never shows what the API
would not; these models only arrange it for people (a run's steps for the plot, a listing's lines with the
diagnostics that point at them, a benchmark's shapes as table rows).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, TypeVar

from markupsafe import Markup
from pydantic import BaseModel, ConfigDict, Field
from sqlmodel import Session

from kernelloop.contract import (
    RUN_COMMIT,
    RUN_VERSION,
    AttemptDetail,
    AttemptDiff,
    AttemptSummary,
    LeaderboardEntry,
    ProblemSummary,
    RunPublic,
    RunStatus,
    StepProgress,
    utcnow,
)
from kernelloop.server.web import run_series
from kernelloop.server.web.highlight import highlighted_lines
from kernelloop.server.web.run_series import RunChart
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
FAILED_CHECKS_SHOWN = 10


class ProblemRow(BaseModel):
    problem: ProblemSummary
    leaders: list[LeaderboardEntry]


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
    best_speedup: float | None = Field(
        description="the best step's speedup (RunChart.best): correct, timed within the load limit"
    )
    best_html: str = Field(description="the page's Best speedup, rendered: the figure linked to its attempt")
    download_html: str = Field(description="the page's Best kernel, rendered: the link that downloads its .py file")
    duration: str = Field(description="the page's Duration, rendered (the run's time so far while it runs)")
    chart: RunChart
    legend_html: str = Field(description="the plot's legend, rendered: each line's name and its values")
    under_way: list[UnderWay]
    rows_html: str


class Setting(BaseModel):
    name: str
    value: str


class RunSettings(BaseModel):
    version: str | None = Field(description=RUN_VERSION)
    commit: str | None = Field(description=RUN_COMMIT)
    items: list[Setting]


class RunView(BaseModel):
    run: RunPublic
    attempts: list[AttemptSummary]
    chart: RunChart
    under_way: list[UnderWay]
    duration_s: float
    settings: RunSettings


class CompareRow(BaseModel):
    run: RunPublic
    line: run_series.ComparedRun
    best: run_series.ChartStep | None
    latest: run_series.ChartStep | None
    steps: int


class SettingRow(BaseModel):
    name: str
    values: list[str] = Field(description="one per compared run, in the runs' order")
    differs: bool


class CompareView(BaseModel):
    runs: list[CompareRow]
    chart: run_series.CompareChart
    settings: list[SettingRow]


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
    attempts = run_series.run_attempts(session, run.id)
    end = run.finished_at or (utcnow() if run.status == RunStatus.active else run.updated_at or run.created_at)
    return RunView(
        run=run,
        attempts=attempts,
        chart=run_series.run_chart(session, attempts),
        under_way=under_way(session, run.id),
        duration_s=max(0.0, (end - run.created_at).total_seconds()),
        settings=run_settings(run),
    )


def compare_view(session: Session, runs: list[RunPublic]) -> CompareView:
    """Runs side by side: one chart of their steps, and their settings as rows (the rows where they differ
    marked)."""
    charts = [run_series.run_chart(session, run_series.run_attempts(session, run.id)) for run in runs]
    labels = [f"run {run.id}" + (f" · {run.name}" if run.name else "") for run in runs]
    chart = run_series.compare_chart([(run.id, label, c) for run, label, c in zip(runs, labels, charts, strict=True)])
    settings = [run_settings(run) for run in runs]
    rows: dict[str, list[str]] = {}
    for i, one in enumerate(settings):
        for item in [
            Setting(name="kernelloop version", value=one.version or "–"),
            Setting(name="commit", value=one.commit or "–"),
            *one.items,
        ]:
            rows.setdefault(item.name, ["–"] * len(runs))[i] = item.value
    compared = [
        CompareRow(run=run, line=line, best=c.best, latest=c.latest, steps=len(c.steps))
        for run, line, c in zip(runs, chart.runs, charts, strict=True)
    ]
    return CompareView(
        runs=compared,
        chart=chart,
        settings=[SettingRow(name=name, values=values, differs=len(set(values)) > 1) for name, values in rows.items()],
    )


def run_settings(run: RunPublic) -> RunSettings:
    """The run's settings as its client stored them, each key once (nested keys joined by dots), and the
    version and commit of the service that created it (server.provenance stamps every run it creates)."""
    return RunSettings(
        version=run.version,
        commit=run.source_commit,
        items=[Setting(name=name, value=value) for name, value in _flat(run.config)],
    )


def _flat(config: Mapping[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    items: list[tuple[str, str]] = []
    for key in sorted(config):
        value = config[key]
        if isinstance(value, Mapping) and value:
            items.extend(_flat(value, f"{prefix}{key}."))
        else:
            items.append(
                (f"{prefix}{key}", "–" if value is None else json.dumps(value) if not isinstance(value, str) else value)
            )
    return items


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
