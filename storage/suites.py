"""Suites: a set of problems, one solution each, scored as KernelBench scores a level.

The entries point at ordinary attempts (recorded and evaluated like any other), so a suite adds no verdicts
of its own: its metrics are read from the attempts' summaries whenever the suite is asked for, and it is
finished once every solution's job has ended.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlmodel import Session, col, func, select

from kernelloop.contract import (
    FAST_P_THRESHOLDS,
    TERMINAL_JOB_STATUSES,
    JobPublic,
    SuiteEntryPublic,
    SuiteLevel,
    SuitePublic,
)
from kernelloop.storage.models import Attempt, Evaluation, Job, Problem, Suite, SuiteEntry, row_id, same_named
from kernelloop.tools.results import Status

ALL_LEVELS = "all"


def create_suite(session: Session, *, name: str | None, backend: str, policy: str | None, client: str) -> Suite:
    suite = Suite(name=name, backend=backend, policy=policy, client=client)
    session.add(suite)
    session.flush()
    return suite


def entry(
    suite_id: int, problem_id: int, level: str, solution: str | None, submitted: JobPublic | str | None
) -> SuiteEntry:
    """An entry row: its job and attempt when the solution was submitted, the reason when it was refused, neither
    when there was no solution."""
    job = submitted if isinstance(submitted, JobPublic) else None
    return SuiteEntry(
        suite_id=suite_id,
        problem_id=problem_id,
        level=level,
        solution=solution,
        attempt_id=job.attempt_id if job else None,
        job_id=job.id if job else None,
        note=submitted if isinstance(submitted, str) else "",
    )


def problem_ids(session: Session, suite_id: int) -> set[int]:
    """The problems a suite has an entry for."""
    return set(session.exec(select(SuiteEntry.problem_id).where(SuiteEntry.suite_id == suite_id)).all())


def list_suites(session: Session, limit: int, offset: int) -> tuple[list[Suite], int]:
    total = session.exec(select(func.count()).select_from(Suite)).one()
    rows = session.exec(select(Suite).order_by(col(Suite.id).desc()).offset(offset).limit(limit)).all()
    return list(rows), total


def suite_public(session: Session, suite: Suite) -> SuitePublic:
    rows = session.exec(
        select(SuiteEntry, Problem, Attempt, Job)
        .join(Problem, col(Problem.id) == SuiteEntry.problem_id)
        .join(Attempt, col(Attempt.id) == SuiteEntry.attempt_id, isouter=True)
        .join(Job, col(Job.id) == SuiteEntry.job_id, isouter=True)
        .where(SuiteEntry.suite_id == row_id(suite))
        .order_by(col(SuiteEntry.id))
    ).all()
    attempt_ids = [entry.attempt_id for entry, *_ in rows if entry.attempt_id is not None]
    failures = _failure_messages(session, attempt_ids)
    seconds = _phase_seconds(session, attempt_ids)
    entries = [
        _entry_public(entry, problem, attempt, job, failures.get(entry.attempt_id or 0, ""))
        for entry, problem, attempt, job in rows
    ]
    for e in entries:
        e.seconds = seconds.get(e.attempt_id or 0, {})
    levels = sorted({e.level for e in entries}, key=_level_order)
    metrics = [level_metrics(level, [e for e in entries if e.level == level]) for level in levels]
    if len(levels) > 1:
        metrics.append(level_metrics(ALL_LEVELS, entries))
    return SuitePublic(
        id=row_id(suite),
        name=suite.name,
        backend=suite.backend,
        policy=suite.policy,
        # no entries yet: the service is still submitting them
        status="finished" if entries and all(e.status != "pending" for e in entries) else "running",
        created_at=suite.created_at,
        levels=metrics,
        entries=entries,
    )


def _failure_messages(session: Session, attempt_ids: list[int]) -> dict[int, str]:
    """Each attempt's latest failed verdict, as `kind: message` (what a suite's reader wants to see first)."""
    failed = session.exec(
        select(Evaluation)
        .where(col(Evaluation.attempt_id).in_(attempt_ids), Evaluation.status != Status.passed)
        .order_by(col(Evaluation.id))
    ).all()
    return {e.attempt_id: f"{e.kind}: {e.message}" for e in failed}


def _phase_seconds(session: Session, attempt_ids: list[int]) -> dict[int, dict[str, float]]:
    """Where each attempt's time went, phase by phase: `KIND` from its start to its end on a lane, `KIND.queued`
    before that, and `KIND.STEP` for each step the phase reports (worker start, runner start, load, the judge's
    reference and checks, timing)."""
    spent: dict[int, dict[str, float]] = {}
    for e in session.exec(select(Evaluation).where(col(Evaluation.attempt_id).in_(attempt_ids))).all():
        times = spent.setdefault(e.attempt_id, {})
        if e.started_at is not None and e.finished_at is not None:
            times[e.kind] = round((e.finished_at - e.started_at).total_seconds(), 3)
            times[f"{e.kind}.queued"] = round((e.started_at - e.created_at).total_seconds(), 3)
        for step, value in (e.result.get("step_seconds") or {}).items():
            times[f"{e.kind}.{step}"] = round(float(value), 3)
    return spent


def _entry_public(
    entry: SuiteEntry, problem: Problem, attempt: Attempt | None, job: Job | None, failure: str
) -> SuiteEntryPublic:
    if attempt is None:
        status = "refused" if entry.note else "no_solution"
    elif job is not None and job.status not in TERMINAL_JOB_STATUSES:
        status = "pending"
    else:
        status = str(attempt.status)
    message = entry.note or (job.note if job is not None and job.note else "") or failure
    return SuiteEntryPublic(
        **same_named(entry, SuiteEntryPublic),
        problem=problem.name,
        status=status,
        correct=bool(attempt is not None and attempt.correct and status != "pending"),
        speedup=attempt.speedup if attempt is not None and status != "pending" else None,
        message=message,
    )


def level_metrics(level: str, entries: Sequence[SuiteEntryPublic]) -> SuiteLevel:
    """Correctness rate and fast_p over every problem of the level: a problem without a solution, or whose
    solution failed, counts in the denominator as KernelBench counts it.

    A `suspicious` solution (correct by its tests, but its benchmark was faster than the memory floor, its timed
    outputs were wrong, or the timing envelope disagreed) counts as correct and is counted apart in `suspicious`;
    fast_p leaves it out at every p, fast_0 included. KernelBench's score.py would count a correct kernel faster
    than p x the reference, but such a kernel has no speedup we can trust, so fast_0 is below the correctness
    rate by the suspicious share (by KernelBench's count it would be in fast_0, and perhaps above)."""
    n = len(entries)
    correct = [e for e in entries if e.correct]
    suspicious = [e for e in correct if e.status == Status.suspicious]
    speedups = [e.speedup for e in correct if e.status != Status.suspicious and e.speedup is not None]
    fast_p = {_p_key(p): (sum(1 for s in speedups if s > p) / n if n else 0.0) for p in FAST_P_THRESHOLDS}
    return SuiteLevel(
        level=level,
        problems=n,
        with_solution=sum(1 for e in entries if e.status not in ("no_solution",)),
        evaluated=sum(1 for e in entries if e.status not in ("no_solution", "pending")),
        correct=len(correct),
        suspicious=len(suspicious),
        correctness_rate=len(correct) / n if n else 0.0,
        fast_p=fast_p,
    )


def _p_key(p: float) -> str:
    return f"fast_{p:g}"


def _level_order(level: str) -> tuple[int, str]:
    digits = "".join(ch for ch in level if ch.isdigit())
    return (int(digits) if digits else 1 << 30, level)
