"""The history: runs, attempts and their evaluations; the queries the API and `kernelloop history` share.

An attempt's summary columns (status, stage, compiled, correct, speedup, device) are updated as each
evaluation is recorded, so listing, filtering and sorting thousands of attempts never opens a result.
`correct` and `speedup` follow tools.coverage: only verdicts that covered the whole problem count. Every benchmark
that timed is appended as a measurement, and the attempt's `speedup` is the statistic of tools.speedup_estimate over
its counted measurements; the runs' best and the leaderboard rank by that module's rule (better beyond the noise:
an interval that clears, or a duel that confirmed it, storage.duels).
"""

from __future__ import annotations

import difflib
import hashlib
import math
import platform
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, get_args

from pydantic import TypeAdapter
from sqlalchemy import ColumnElement, delete, func
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
    MeasurementPublic,
    Page,
    RunCreate,
    RunPublic,
    RunStatus,
    RunUpdate,
    ShapeMeasurement,
    SubmissionRequest,
    utcnow,
)
from kernelloop.storage.duels import beats_among
from kernelloop.storage.models import (
    Attempt,
    CodeBlob,
    Evaluation,
    Job,
    Measurement,
    Problem,
    Run,
    row_id,
    same_named,
)
from kernelloop.storage.problems import spec_of
from kernelloop.tools.coverage import Counted, counted
from kernelloop.tools.problems import ProblemSpec
from kernelloop.tools.results import (
    Backend,
    BenchmarkResult,
    Mode,
    PhaseResult,
    PhaseResultAny,
    Status,
    TestResult,
    compile_part,
)
from kernelloop.tools.speedup_estimate import (
    Sample,
    SpeedupEstimate,
    best_in_order,
    deviation,
    estimate,
    ranked,
    sample_of,
    stated,
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


def create_run(
    session: Session,
    problem: Problem,
    request: RunCreate,
    *,
    version: str | None = None,
    source_commit: str | None = None,
) -> Run:
    """A new run; `version` and `source_commit`: those of the service that creates it."""
    run = Run(**same_named(request, Run), problem_id=row_id(problem), version=version, source_commit=source_commit)
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
        contenders = session.exec(
            select(Attempt)
            .where(Attempt.run_id == run.id, col(Attempt.correct).is_(True), col(Attempt.speedup).is_not(None))
            .order_by(col(Attempt.id))
        ).all()
        beats = beats_among(session, [row_id(a) for a in contenders])
        best = best_in_order(((row_id(a), e) for a in contenders if (e := estimate_of(a)) is not None), beats)
        out.append(
            RunPublic.model_validate(
                {
                    **_columns(run, RunPublic.model_fields),
                    "problem": names.get(run.problem_id, "?"),
                    "mode": run.config.get("mode") if run.config.get("mode") in get_args(Mode) else "infer",
                    "attempts": counts.get(run.id, 0),
                    "best_attempt_id": best[0] if best else None,
                    "best_speedup": best[1].speedup if best else None,
                    "best_speedup_low": best[1].low if best else None,
                    "best_speedup_high": best[1].high if best else None,
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
    """Record a submission. Within a run, the same code on the same backend in the same mode is the same attempt
    (a compile, then a test, then a benchmark of one kernel); returns (attempt, reused)."""
    digest = store_code(session, request.code)
    mode = request.options.mode if request.options is not None else "infer"

    def existing() -> Attempt | None:
        if request.run_id is None:
            return None
        return session.exec(
            select(Attempt).where(
                Attempt.run_id == request.run_id,
                Attempt.code_sha256 == digest,
                Attempt.backend == backend,
                Attempt.mode == mode,
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
        mode=mode,
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
    mode: Mode = "infer",
    created_at: datetime,
    started_at: datetime,
    finished_at: datetime,
) -> Evaluation:
    """Store one verdict (judged in `mode`, its job's) with its log, and bring the attempt's summary up to date (one
    transaction)."""
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
        mode=mode,
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
    verdict = counted(problem_spec(session, attempt.problem_id), result)
    _summarize(attempt, result, verdict)
    if isinstance(result, BenchmarkResult):
        session.flush()  # the evaluation's id, for its measurement
        _measure(session, attempt, evaluation, result, verdict)
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


def _measure(
    session: Session, attempt: Attempt, evaluation: Evaluation, result: BenchmarkResult, verdict: Counted
) -> None:
    """Append the benchmark as a measurement of the attempt (one that passed with a speedup: a failed or suspicious
    benchmark measured nothing), and restate the attempt's speedup over its counted measurements."""
    sample = sample_of(result)
    if not result.ok or sample is None:
        return
    before = counted_samples(session, row_id(attempt))
    slowdowns = [s.host_slowdown for s in result.shapes if s.host_slowdown is not None]
    not_counted = ""
    if result.host_too_loaded:
        not_counted = f"timed on an overloaded host (host_slowdown {max(slowdowns, default=0):.2f}): kept, not ranked"
    elif verdict.speedup is None:
        not_counted = verdict.coverage.note if verdict.coverage is not None else "not a full benchmark"
    job = session.get(Job, evaluation.job_id) if evaluation.job_id is not None else None
    compiled = compile_part(result)
    toolchain = compiled.toolchain if compiled is not None else {}
    session.add(
        Measurement(
            attempt_id=row_id(attempt),
            evaluation_id=row_id(evaluation),
            job_id=evaluation.job_id,
            step=job.run_step if job is not None else None,
            measured_at=evaluation.finished_at or utcnow(),
            host=platform.node(),
            backend=result.backend,
            device=result.device,
            host_slowdown=max(slowdowns, default=None),
            host_too_loaded=result.host_too_loaded,
            counted=not not_counted,
            not_counted=not_counted,
            speedup=sample.speedup,
            low=math.exp(math.log(sample.speedup) - sample.log_half_width),
            high=math.exp(math.log(sample.speedup) + sample.log_half_width),
            deviation=deviation(sample.speedup, before),
            torch=toolchain.get("torch"),
            toolchain=toolchain,
            shapes=[
                ShapeMeasurement(
                    shape=s.shape,
                    speedup=s.speedup,
                    candidate=s.candidate,
                    reference=s.reference,
                    host_slowdown=s.host_slowdown,
                ).model_dump(mode="json")
                for s in result.shapes
            ],
        )
    )
    _restate(attempt, [*before, sample] if not not_counted else before)


def _restate(attempt: Attempt, samples: list[Sample]) -> None:
    """The attempt's speedup columns: the statistic over its counted samples."""
    stated = estimate(samples)
    attempt.speedup = stated.speedup if stated else None
    attempt.speedup_low = stated.low if stated else None
    attempt.speedup_high = stated.high if stated else None
    attempt.measurements = stated.n if stated else 0


def counted_samples(session: Session, attempt_id: int) -> list[Sample]:
    """The samples of an attempt's counted measurements, oldest first."""
    rows = session.exec(
        select(Measurement.speedup, Measurement.low)
        .where(Measurement.attempt_id == attempt_id, col(Measurement.counted).is_(True))
        .order_by(col(Measurement.id))
    ).all()
    return [Sample(speedup=speedup, log_half_width=math.log(speedup / low)) for speedup, low in rows]


def estimate_of(attempt: Attempt) -> SpeedupEstimate | None:
    """An attempt's stated speedup, as its summary columns hold it; None before a counted measurement."""
    return stated(attempt.speedup, attempt.speedup_low, attempt.speedup_high, attempt.measurements)


def recount_attempts(session: Session) -> int:
    """Recompute every tested or timed attempt's `correct`, measurements and speedup from its evaluations, in the
    order they were made (the upgrade to schema v7: every benchmark that timed becomes a measurement); returns how
    many attempts were recounted. Flushes, does not commit."""
    session.exec(delete(Measurement))
    verdicts = session.exec(
        select(Evaluation).where(col(Evaluation.kind).in_(["test", "benchmark"])).order_by(col(Evaluation.id))
    ).all()
    specs: dict[int, ProblemSpec] = {}
    recounted: set[int] = set()
    for evaluation in verdicts:
        attempt = session.get(Attempt, evaluation.attempt_id)
        assert attempt is not None
        if evaluation.attempt_id not in recounted:
            attempt.correct = None
            _restate(attempt, [])
            recounted.add(evaluation.attempt_id)
        if attempt.problem_id not in specs:
            specs[attempt.problem_id] = problem_spec(session, attempt.problem_id)
        result = parse_result(evaluation.result)
        verdict = counted(specs[attempt.problem_id], result)
        _count(attempt, verdict)
        if isinstance(result, BenchmarkResult):
            _measure(session, attempt, evaluation, result, verdict)
        session.add(attempt)
        session.flush()
    return len(recounted)


def measurements(session: Session, attempt_id: int) -> list[MeasurementPublic]:
    """Every measurement of an attempt, oldest first."""
    return measurements_of(session, [attempt_id]).get(attempt_id, [])


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
    if f.mode is not None:
        conditions.append(col(Attempt.mode) == f.mode)
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


def measurements_of(session: Session, attempt_ids: Sequence[int]) -> dict[int, list[MeasurementPublic]]:
    """Every measurement of each attempt, oldest first (a plot of a run's steps reads them all at once)."""
    rows = session.exec(
        select(Measurement).where(col(Measurement.attempt_id).in_(attempt_ids)).order_by(col(Measurement.id))
    ).all()
    out: dict[int, list[MeasurementPublic]] = {}
    for row in rows:
        out.setdefault(row.attempt_id, []).append(MeasurementPublic.model_validate(row, from_attributes=True))
    return out


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
    session: Session,
    *,
    problem_id: int | None = None,
    backend: Backend | None = None,
    mode: Mode = "infer",
    limit: int = 10,
) -> list[LeaderboardEntry]:
    """Correct attempts judged in `mode` ranked by the rule of tools.speedup_estimate (`ranked`: the first in the
    order they were made, replaced only by one whose interval clears it or that a duel between them confirmed): the
    top `limit` of one problem, or the best of every problem (a forward's speedup and a forward+backward's are not
    ranked together)."""
    base = (
        select(Attempt, Problem.name)
        .join(Problem, col(Problem.id) == col(Attempt.problem_id))
        .where(col(Attempt.correct).is_(True), col(Attempt.speedup).is_not(None), col(Attempt.mode) == mode)
        .order_by(col(Attempt.id))
    )
    if backend is not None:
        base = base.where(Attempt.backend == backend)
    if problem_id is not None:
        problem_ids = [problem_id]
    else:
        problem_ids = [pid for pid in session.exec(select(Problem.id).order_by(Problem.name)).all() if pid is not None]
        limit = 1
    entries: list[LeaderboardEntry] = []
    for pid in problem_ids:
        rows = {row_id(a): (a, name) for a, name in session.exec(base.where(Attempt.problem_id == pid)).all()}
        contenders = [(i, e) for i, (a, _) in rows.items() if (e := estimate_of(a)) is not None]
        places = ranked(contenders, limit, beats_among(session, rows))
        for rank, (attempt_id, _) in enumerate(places, start=1):
            attempt, name = rows[attempt_id]
            entries.append(
                LeaderboardEntry(
                    **same_named(attempt, LeaderboardEntry),
                    rank=rank,
                    problem=name,
                    attempt_id=attempt_id,
                )
            )
    return entries


def parse_result(data: Mapping[str, Any]) -> PhaseResult:
    return RESULT_ADAPTER.validate_python(data)
