"""The history: runs, attempts and their evaluations; the queries the API and `kernelloop history` share.

An attempt's summary columns (status, stage, compiled, correct, speedup, device) are updated as each
evaluation is recorded, so listing, filtering and sorting thousands of attempts never opens a result.
`correct` and `speedup` follow tools.coverage: only verdicts that covered the whole problem count.
"""

from __future__ import annotations

import difflib
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from pydantic import TypeAdapter
from sqlalchemy import ColumnElement, func
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select
from sqlmodel.sql.expression import Select

from kernelloop.contract import (
    AttemptDetail,
    AttemptDiff,
    AttemptFilter,
    AttemptSummary,
    EvaluationPublic,
    JobStatus,
    LeaderboardEntry,
    Page,
    RunCreate,
    RunPublic,
    RunStatus,
    RunUpdate,
    SubmissionRequest,
    utcnow,
)
from kernelloop.storage.models import Attempt, CodeBlob, Evaluation, Job, Problem, Run, row_id, same_named
from kernelloop.storage.problems import spec_of
from kernelloop.tools.coverage import Counted, counted
from kernelloop.tools.problems import ProblemSpec
from kernelloop.tools.results import (
    Backend,
    BenchmarkResult,
    PhaseResult,
    PhaseResultAny,
    Status,
    TestResult,
    compile_part,
)

RESULT_ADAPTER: TypeAdapter[PhaseResult] = TypeAdapter(PhaseResultAny)


def _columns(row: object, names: Iterable[str]) -> dict[str, object]:
    """The row's values for the fields of a public model (rows hold enums as plain strings)."""
    return {name: getattr(row, name) for name in names if hasattr(row, name)}


COMPILE_FAILURES = {Status.compile_error, Status.missing_model_new, Status.signature_error}


# -------------------------------------------------------------------------------------------- code


def store_code(session: Session, text: str) -> str:
    """Keep the source once, keyed by its sha256 (a concurrent insert of the same text is fine)."""
    digest = hashlib.sha256(text.encode()).hexdigest()
    if session.get(CodeBlob, digest) is None:
        try:
            session.add(CodeBlob(sha256=digest, text=text, size_bytes=len(text.encode())))
            session.commit()
        except IntegrityError:
            session.rollback()
    return digest


# -------------------------------------------------------------------------------------------- runs


def create_run(session: Session, problem: Problem, request: RunCreate) -> Run:
    run = Run(**same_named(request, Run), problem_id=row_id(problem))
    session.add(run)
    session.commit()
    session.refresh(run)
    return run


def update_run(session: Session, run: Run, update: RunUpdate) -> Run:
    if update.status is not None:
        run.status = update.status
        if update.status == RunStatus.active:
            run.finished_at = None  # reopened, e.g. by `kernelloop agent resume`
        elif run.finished_at is None:
            run.finished_at = utcnow()
    if update.notes is not None:
        run.notes = update.notes
    if update.meta is not None:
        run.meta = {**run.meta, **update.meta}
    run.updated_at = utcnow()
    session.add(run)
    session.commit()
    session.refresh(run)
    return run


def interrupt_silent_runs(session: Session, silent_since: datetime) -> list[int]:
    """Mark interrupted every active run nothing has happened in since `silent_since`: its client has not
    written to it (a PATCH, the agent's heartbeat), no attempt of it was made or evaluated, and no job of it is
    queued or running. Its notes say when and why; its finished_at is the moment. Returns the runs' ids."""
    busy = (
        select(Attempt.run_id)
        .join(Job, col(Job.attempt_id) == col(Attempt.id))
        .where(col(Job.status).in_([JobStatus.queued.value, JobStatus.running.value]))
    )
    recent = select(Attempt.run_id).where(
        func.coalesce(col(Attempt.updated_at), col(Attempt.created_at)) >= silent_since
    )
    silent = session.exec(
        select(Run).where(
            Run.status == RunStatus.active.value,
            func.coalesce(col(Run.updated_at), col(Run.created_at)) < silent_since,
            col(Run.id).not_in(busy.where(col(Attempt.run_id).is_not(None))),
            col(Run.id).not_in(recent.where(col(Attempt.run_id).is_not(None))),
        )
    ).all()
    now = utcnow()
    for run in silent:
        last = run.updated_at or run.created_at
        run.status = RunStatus.interrupted
        run.finished_at = run.updated_at = now
        run.notes = (
            f"interrupted at {now:%Y-%m-%d %H:%M:%S} UTC: no word from its client since {last:%Y-%m-%d %H:%M:%S} UTC "
            "and nothing of it running; `kernelloop agent resume` continues an agent's run, PATCH /v1/runs/ID "
            "with status active reopens any other"
        )
        session.add(run)
    session.commit()
    return [row_id(run) for run in silent]


def run_public(session: Session, run: Run) -> RunPublic:
    return _runs_public(session, [run])[0]


def _runs_public(session: Session, runs: Sequence[Run]) -> list[RunPublic]:
    ids = [row_id(r) for r in runs]
    counts = dict(
        session.exec(
            select(Attempt.run_id, func.count()).where(col(Attempt.run_id).in_(ids)).group_by(col(Attempt.run_id))
        ).all()
    )
    names = dict(session.exec(select(Problem.id, Problem.name)).all())
    out = []
    for run in runs:
        best = session.exec(
            select(Attempt.id, Attempt.speedup)
            .where(Attempt.run_id == run.id, col(Attempt.correct).is_(True), col(Attempt.speedup).is_not(None))
            .order_by(col(Attempt.speedup).desc())
            .limit(1)
        ).first()
        out.append(
            RunPublic.model_validate(
                {
                    **_columns(run, RunPublic.model_fields),
                    "problem": names.get(run.problem_id, "?"),
                    "attempts": counts.get(run.id, 0),
                    "best_attempt_id": best[0] if best else None,
                    "best_speedup": best[1] if best else None,
                }
            )
        )
    return out


def list_runs(
    session: Session,
    *,
    problem_id: int | None = None,
    status: RunStatus | None = None,
    limit: int = 50,
    offset: int = 0,
) -> Page[RunPublic]:
    query = select(Run)
    if problem_id is not None:
        query = query.where(Run.problem_id == problem_id)
    if status is not None:
        query = query.where(Run.status == status.value)
    total = session.exec(select(func.count()).select_from(query.subquery())).one()
    runs = session.exec(query.order_by(col(Run.id).desc()).limit(limit).offset(offset)).all()
    return Page[RunPublic](items=_runs_public(session, runs), total=total, limit=limit, offset=offset)


# ---------------------------------------------------------------------------------------- attempts


def create_attempt(
    session: Session, problem: Problem, request: SubmissionRequest, backend: Backend, client: str
) -> tuple[Attempt, bool]:
    """Record a submission. Within a run, the same code on the same backend is the same attempt
    (a compile, then a test, then a benchmark of one kernel); returns (attempt, reused)."""
    digest = store_code(session, request.code)

    def existing() -> Attempt | None:
        if request.run_id is None:
            return None
        return session.exec(
            select(Attempt).where(
                Attempt.run_id == request.run_id, Attempt.code_sha256 == digest, Attempt.backend == backend
            )
        ).first()

    found = existing()
    if found is not None:
        return found, True
    attempt = Attempt(
        problem_id=row_id(problem),
        run_id=request.run_id,
        parent_id=request.parent_attempt_id,
        step=request.step,
        backend=backend,
        proposer=request.proposer,
        rationale=request.rationale,
        code_sha256=digest,
        client=client,
    )
    session.add(attempt)
    try:
        session.commit()
    except IntegrityError:  # a concurrent submission of the same code in the same run got there first
        session.rollback()
        found = existing()
        if found is None:
            raise
        return found, True
    session.refresh(attempt)
    return attempt, False


def record_evaluation(
    session: Session,
    attempt_id: int,
    job_id: int | None,
    result: PhaseResult,
    *,
    created_at: datetime,
    started_at: datetime,
    finished_at: datetime,
) -> Evaluation:
    """Store one verdict with its log, and bring the attempt's summary up to date (one transaction)."""
    compiled = compile_part(result)
    log = compiled.log if compiled is not None else ""
    if result.sandbox is not None and not log:
        log = "\n".join(part for part in (result.sandbox.stdout, result.sandbox.stderr) if part)
    speedup = result.geomean_speedup if isinstance(result, BenchmarkResult) else None
    evaluation = Evaluation(
        attempt_id=attempt_id,
        job_id=job_id,
        kind=result.kind,
        status=result.status,
        message=result.message,
        backend=result.backend,
        device=result.device,
        isolation=result.sandbox.isolation if result.sandbox else None,
        toolchain=compiled.toolchain if compiled is not None else {},
        build_seconds=compiled.build_seconds if compiled is not None else None,
        wall_seconds=result.sandbox.wall_seconds if result.sandbox else None,
        speedup=speedup,
        created_at=created_at,
        started_at=started_at,
        finished_at=finished_at,
        result=result.model_dump(mode="json"),
        log=log,
    )
    session.add(evaluation)
    attempt = session.get(Attempt, attempt_id)
    assert attempt is not None
    _summarize(attempt, result, counted(problem_spec(session, attempt.problem_id), result))
    session.add(attempt)
    session.commit()
    session.refresh(evaluation)
    return evaluation


def problem_spec(session: Session, problem_id: int) -> ProblemSpec:
    problem = session.get(Problem, problem_id)
    assert problem is not None
    return spec_of(problem)


def _summarize(attempt: Attempt, result: PhaseResult, verdict: Counted) -> None:
    attempt.status, attempt.stage, attempt.updated_at = result.status.value, result.kind, utcnow()
    compiled = compile_part(result)
    if compiled is not None and (compiled.status == Status.passed or compiled.status in COMPILE_FAILURES):
        attempt.compiled = compiled.status == Status.passed
    _count(attempt, verdict)
    if result.device and (isinstance(result, (TestResult, BenchmarkResult)) or not attempt.device):
        attempt.device = result.device


def _count(attempt: Attempt, verdict: Counted) -> None:
    if verdict.correct is not None:
        attempt.correct = verdict.correct
    if verdict.speedup is not None:
        attempt.speedup = verdict.speedup  # the most recent full-coverage timing, not the best of several


def recount_attempts(session: Session) -> int:
    """Recompute every tested or timed attempt's `correct` and `speedup` from its evaluations by the coverage
    rule (the upgrade to schema v2); returns how many attempts were recounted. Flushes, does not commit."""
    verdicts = session.exec(
        select(Evaluation.attempt_id, Evaluation.result)
        .where(col(Evaluation.kind).in_(["test", "benchmark"]))
        .order_by(col(Evaluation.attempt_id), col(Evaluation.id))
    ).all()
    specs: dict[int, ProblemSpec] = {}
    recounted: set[int] = set()
    for attempt_id, result in verdicts:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None
        if attempt_id not in recounted:
            attempt.correct, attempt.speedup = None, None
            recounted.add(attempt_id)
        if attempt.problem_id not in specs:
            specs[attempt.problem_id] = problem_spec(session, attempt.problem_id)
        _count(attempt, counted(specs[attempt.problem_id], parse_result(result)))
        session.add(attempt)
    session.flush()
    return len(recounted)


SummaryQuery = Select[Attempt, str, int]
"""attempts with their problem's name and their code's size"""


def _summary_rows(session: Session, query: SummaryQuery) -> list[AttemptSummary]:
    return [
        AttemptSummary.model_validate(
            {**_columns(attempt, AttemptSummary.model_fields), "problem": name, "code_bytes": size}
        )
        for attempt, name, size in session.exec(query).all()
    ]


def _summary_query() -> SummaryQuery:
    return (
        select(Attempt, Problem.name, CodeBlob.size_bytes)
        .join(Problem, col(Problem.id) == col(Attempt.problem_id))
        .join(CodeBlob, col(CodeBlob.sha256) == col(Attempt.code_sha256))
    )


def list_attempts(session: Session, f: AttemptFilter) -> Page[AttemptSummary]:
    """One page of attempts, filtered and sorted (NULL speedups last whatever the order)."""
    conditions: list[ColumnElement[bool]] = []
    if f.problem is not None:
        conditions.append(col(Problem.name) == f.problem)
    if f.run_id is not None:
        conditions.append(col(Attempt.run_id) == f.run_id)
    if f.status is not None:
        conditions.append(col(Attempt.status) == f.status.value)
    if f.backend is not None:
        conditions.append(col(Attempt.backend) == f.backend)
    if f.proposer is not None:
        conditions.append(col(Attempt.proposer) == f.proposer)
    if f.correct is not None:
        conditions.append(col(Attempt.correct) == f.correct)
    if f.min_speedup is not None:
        conditions.append(col(Attempt.speedup) >= f.min_speedup)
    key = {
        "created": col(Attempt.created_at),
        "speedup": col(Attempt.speedup),
        "step": col(Attempt.step),
        "id": col(Attempt.id),
    }[f.sort]
    ordered = key.desc() if f.order == "desc" else key.asc()
    tiebreak = col(Attempt.id).desc() if f.order == "desc" else col(Attempt.id).asc()
    query = _summary_query().where(*conditions)
    count_query = select(func.count()).select_from(Attempt).join(Problem, col(Problem.id) == col(Attempt.problem_id))
    total = session.exec(count_query.where(*conditions)).one()
    rows = _summary_rows(session, query.order_by(ordered.nulls_last(), tiebreak).limit(f.limit).offset(f.offset))
    return Page[AttemptSummary](items=rows, total=total, limit=f.limit, offset=f.offset)


def attempt_summary(session: Session, attempt_id: int) -> AttemptSummary | None:
    rows = _summary_rows(session, _summary_query().where(Attempt.id == attempt_id))
    return rows[0] if rows else None


def attempt_detail(session: Session, attempt_id: int) -> AttemptDetail | None:
    summary = attempt_summary(session, attempt_id)
    if summary is None:
        return None
    code = session.get(CodeBlob, summary.code_sha256)
    evaluations = session.exec(
        select(Evaluation).where(Evaluation.attempt_id == attempt_id).order_by(col(Evaluation.id))
    ).all()
    jobs = [row_id(job) for job in session.exec(select(Job).where(Job.attempt_id == attempt_id).order_by(col(Job.id)))]
    attempt = session.get(Attempt, attempt_id)
    assert attempt is not None
    spec = problem_spec(session, attempt.problem_id)
    return AttemptDetail(
        **summary.model_dump(),
        code=code.text if code else "",
        evaluations=[evaluation_public(e, spec) for e in evaluations],
        jobs=jobs,
    )


def evaluation_public(evaluation: Evaluation, spec: ProblemSpec) -> EvaluationPublic:
    result = parse_result(evaluation.result)
    return EvaluationPublic.model_validate(
        {
            **_columns(evaluation, EvaluationPublic.model_fields),
            "result": result,
            "coverage": counted(spec, result).coverage,
        }
    )


def latest_benchmarks(session: Session, attempt_ids: Sequence[int]) -> dict[int, BenchmarkResult]:
    """Each attempt's most recent passed benchmark, per shape timings and all (a plot of a run's steps)."""
    rows = session.exec(
        select(Evaluation.attempt_id, Evaluation.result)
        .where(
            col(Evaluation.attempt_id).in_(attempt_ids), Evaluation.kind == "benchmark", Evaluation.status == "passed"
        )
        .order_by(col(Evaluation.id))
    ).all()
    latest: dict[int, BenchmarkResult] = {}
    for attempt_id, data in rows:
        result = parse_result(data)
        if isinstance(result, BenchmarkResult):
            latest[attempt_id] = result
    return latest


def attempt_code(session: Session, attempt_id: int) -> str | None:
    attempt = session.get(Attempt, attempt_id)
    if attempt is None:
        return None
    blob = session.get(CodeBlob, attempt.code_sha256)
    return blob.text if blob else ""


def diff_attempts(session: Session, from_id: int, to_id: int) -> AttemptDiff | None:
    old, new = attempt_code(session, from_id), attempt_code(session, to_id)
    if old is None or new is None:
        return None
    lines = difflib.unified_diff(
        old.splitlines(keepends=True),
        new.splitlines(keepends=True),
        fromfile=f"attempt {from_id}",
        tofile=f"attempt {to_id}",
    )
    return AttemptDiff(from_attempt=from_id, to_attempt=to_id, identical=old == new, diff="".join(lines))


def leaderboard(
    session: Session, *, problem_id: int | None = None, backend: Backend | None = None, limit: int = 10
) -> list[LeaderboardEntry]:
    """Correct attempts by speedup: the top `limit` of one problem, or the best of every problem."""
    base = (
        select(Attempt, Problem.name)
        .join(Problem, col(Problem.id) == col(Attempt.problem_id))
        .where(col(Attempt.correct).is_(True), col(Attempt.speedup).is_not(None))
    )
    if backend is not None:
        base = base.where(Attempt.backend == backend)
    order = (col(Attempt.speedup).desc(), col(Attempt.id).asc())
    if problem_id is not None:
        rows = session.exec(base.where(Attempt.problem_id == problem_id).order_by(*order).limit(limit)).all()
    else:
        problem_ids = session.exec(select(Problem.id).order_by(Problem.name)).all()
        rows = [
            row
            for pid in problem_ids
            for row in session.exec(base.where(Attempt.problem_id == pid).order_by(*order).limit(1)).all()
        ]
    return [
        LeaderboardEntry(
            **same_named(a, LeaderboardEntry),
            rank=i + 1 if problem_id is not None else 1,
            problem=name,
            attempt_id=a.id,
        )
        for i, (a, name) in enumerate(rows)
    ]


def parse_result(data: Mapping[str, Any]) -> PhaseResult:
    return RESULT_ADAPTER.validate_python(data)
