"""The job queue, kept in the database so that a restart loses nothing.

A job is one or more steps (compile, test, benchmark). Each step runs on a lane of one kind: builds and
everything on the cpu backend on CPU lanes, tests and benchmarks on the cuda backend on GPU lanes (one
job at a time per GPU). A lane claims the oldest queued job that needs its kind with a conditional
UPDATE, so two lanes never take the same job. At start-up, a job left `running` by a service that
stopped is marked interrupted (note, counter, event) and queued again, or failed after too many tries.
A job whose cancel was asked (storage.cancel) is never started or queued again: each of those paths ends it
`cancelled` instead. Every change is also a row in `job_events`, which the SSE stream replays.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Engine, func, update
from sqlmodel import Session, col, select

from kernelloop.contract import JobLinks, JobPublic, JobStatus, LaneKind, StepProgress, utcnow
from kernelloop.storage import cancel, idempotency
from kernelloop.storage.history import estimate_of, parse_result, record_evaluation
from kernelloop.storage.models import Attempt, CodeBlob, Evaluation, Job, JobEvent, Problem, row_id, same_named
from kernelloop.storage.problems import spec_of
from kernelloop.tools.coverage import counted
from kernelloop.tools.jobs import EvalOptions, Step
from kernelloop.tools.phase_registry import PHASES, JobPhase, Phase, steps_of
from kernelloop.tools.problems import ProblemSpec
from kernelloop.tools.results import (
    Backend,
    BenchmarkResult,
    PhaseResult,
    Status,
    TestResult,
    compile_part,
)


def steps_for(phase: JobPhase, backend: Backend) -> list[Phase]:
    """The steps of a job. On the cuda backend a test or benchmark is built first on a CPU lane, so a
    long nvcc build never holds a GPU; on the cpu backend the test and benchmark build for themselves."""
    steps = list(steps_of(phase))
    if backend == "cuda" and PHASES[steps[0]].needs_gpu:
        steps.insert(0, "compile")
    return steps


def lane_kind(step: Phase, backend: Backend) -> LaneKind:
    return "gpu" if backend == "cuda" and PHASES[step].needs_gpu else "cpu"


def add_event(session: Session, job_id: int, type_: str, **data: object) -> None:
    session.add(JobEvent(job_id=job_id, type=type_, data=data))


def enqueue(
    session: Session,
    attempt: Attempt,
    phase: JobPhase,
    options: EvalOptions,
    client: str,
    once: idempotency.CallKey | None = None,
    *,
    run_step: int | None = None,
) -> Job:
    """Queue the attempt's job (asked for by the run's step `run_step`, if any); with `once`, its idempotency key in
    the same transaction (an IntegrityError when a concurrent call with the same key got there first: nothing is
    queued)."""
    steps = steps_for(phase, attempt.backend)
    job = Job(
        attempt_id=row_id(attempt),
        phase=phase,
        steps=steps,
        needs=lane_kind(steps[0], attempt.backend),
        options=options.model_dump(mode="json"),
        client=client,
        status=JobStatus.queued,
        run_step=run_step,
    )
    session.add(job)
    attempt.status, attempt.updated_at = "pending", utcnow()
    session.add(attempt)
    session.flush()
    if once is not None:
        idempotency.remember(session, once, row_id(job))
    add_event(session, row_id(job), "queued", steps=steps, needs=job.needs, queue_position=queue_position(session, job))
    session.commit()
    session.refresh(job)
    return job


def claim_next(engine: Engine, needs: LaneKind, lane: str) -> int | None:
    """Take the oldest queued job for this lane kind; None when there is none."""
    with Session(engine) as session:
        for _ in range(20):  # another lane may win the race for a job; then try the next one
            job_id = _oldest_queued(session, needs)
            if job_id is None:
                return None
            now = utcnow()
            # claimed only if it is still queued for this kind: between the two statements another lane may
            # have run its step and queued its next one, which may need the other kind (a build, then a test)
            claimed = session.exec(
                update(Job)
                .where(col(Job.id) == job_id, col(Job.status) == JobStatus.queued.value, col(Job.needs) == needs)
                .values(
                    status=JobStatus.running.value,
                    lane=lane,
                    updated_at=now,
                    started_at=func.coalesce(Job.started_at, now),
                )
            )
            if claimed.rowcount == 1:
                job = session.get(Job, job_id, populate_existing=True)
                assert job is not None
                if job.cancel_requested_at is not None:  # asked while it was queued again: it ends here
                    cancel.end(session, job, "cancelled: its next step was not started")
                    session.commit()
                    continue
                add_event(session, job_id, "started", step=job.steps[job.step_index], lane=lane)
                session.commit()
                return job_id
            session.rollback()
    return None


def _oldest_queued(session: Session, needs: LaneKind) -> int | None:
    return session.exec(
        select(Job.id).where(Job.status == JobStatus.queued.value, Job.needs == needs).order_by(col(Job.id)).limit(1)
    ).first()


def current_step(session: Session, job_id: int) -> Step:
    """Everything a lane needs to run a job's current step: the step itself, as its worker will get it."""
    job = session.get(Job, job_id)
    assert job is not None
    attempt = session.get(Attempt, job.attempt_id)
    assert attempt is not None
    problem = session.get(Problem, attempt.problem_id)
    code = session.get(CodeBlob, attempt.code_sha256)
    assert problem is not None and code is not None
    return Step(
        phase=job.steps[job.step_index],
        problem=ProblemSpec.model_validate(problem.spec),
        code=code.text,
        backend=attempt.backend,
        options=EvalOptions.model_validate(job.options),
    )


def progress_data(result: PhaseResult) -> dict[str, object]:
    """A small summary of a result-so-far, for a progress event."""
    data: dict[str, object] = {"kind": result.kind, "status": result.status.value, "message": result.message}
    compiled = compile_part(result)
    if compiled is not None:
        data["build_seconds"], data["cache_hit"] = compiled.build_seconds, compiled.cache_hit
    if isinstance(result, TestResult) and result.checks:
        last = result.checks[-1]
        data["checks_done"] = len(result.checks)
        data["last_check"] = {
            "shape": last.shape,
            "seed": last.seed,
            "status": last.status.value,
            "max_rel_error": last.max_rel_error,
        }
    if isinstance(result, BenchmarkResult) and result.shapes:
        last_shape = result.shapes[-1]
        data["shapes_done"] = len(result.shapes)
        data["last_shape"] = {
            "shape": last_shape.shape,
            "status": last_shape.status.value,
            "speedup": last_shape.speedup,
        }
    return data


def record_progress(engine: Engine, job_id: int, result: PhaseResult) -> None:
    with Session(engine) as session:
        add_event(session, job_id, "progress", **progress_data(result))
        session.commit()


def finish_step(
    engine: Engine, job_id: int, result: PhaseResult, *, started_at: datetime, finished_at: datetime
) -> Job:
    """Keep the step's verdict; queue the next step if it passed, else finish the job."""
    with Session(engine) as session:
        job = session.get(Job, job_id)
        assert job is not None
        evaluation = record_evaluation(
            session,
            job.attempt_id,
            job_id,
            result,
            mode=EvalOptions.model_validate(job.options).mode,
            created_at=job.created_at,
            started_at=started_at,
            finished_at=finished_at,
        )
        step = job.steps[job.step_index]
        extra = {"speedup": result.geomean_speedup} if isinstance(result, BenchmarkResult) else {}
        add_event(
            session,
            job_id,
            "step_finished",
            step=step,
            status=result.status.value,
            message=result.message,
            evaluation_id=evaluation.id,
            **extra,
        )
        session.flush()  # the write opens the transaction: a cancel stored while the step ran is seen below
        job = session.get(Job, job_id, with_for_update=True, populate_existing=True)  # locked on PostgreSQL
        assert job is not None
        attempt = session.get(Attempt, job.attempt_id)
        assert attempt is not None
        job.outcome, job.updated_at, job.lane = result.status.value, utcnow(), None
        if job.cancel_requested_at is not None:
            cancel.end(session, job, f"cancelled: its {step} step had finished; no later step ran")
        elif result.status == Status.passed and job.step_index + 1 < len(job.steps):
            job.step_index += 1
            job.needs = lane_kind(job.steps[job.step_index], attempt.backend)
            job.status = JobStatus.queued
            attempt.status = "pending"
            session.add(attempt)
            session.add(job)
            session.flush()
            add_event(
                session,
                job_id,
                "queued",
                step=job.steps[job.step_index],
                needs=job.needs,
                queue_position=queue_position(session, job),
            )
        else:
            job.status, job.finished_at = JobStatus.finished, utcnow()
            session.add(job)
            add_event(session, job_id, "finished", outcome=result.status.value, attempt_id=job.attempt_id)
        session.commit()
        session.refresh(job)
        return job


def fail_job(engine: Engine, job_id: int, note: str) -> None:
    """The service could not run the job (not the submission's fault): keep it, visibly failed."""
    with Session(engine) as session:
        job = session.get(Job, job_id)
        assert job is not None
        _fail(session, job, note)
        session.commit()


def add_note(engine: Engine, job_id: int, note: str) -> None:
    with Session(engine) as session:
        job = session.get(Job, job_id)
        assert job is not None
        job.note = (job.note + "\n" if job.note else "") + note
        session.add(job)
        session.commit()


def _fail(session: Session, job: Job, note: str) -> None:
    job.status, job.finished_at, job.updated_at, job.lane = JobStatus.failed, utcnow(), utcnow(), None
    job.note = (job.note + "\n" if job.note else "") + note
    session.add(job)
    attempt = session.get(Attempt, job.attempt_id)
    if attempt is not None and attempt.status == "pending":
        attempt.status = "failed"
        session.add(attempt)
    add_event(session, row_id(job), "failed", note=note)


def requeue_running(engine: Engine, *, max_interruptions: int, reason: str, counts: bool = True) -> list[int]:
    """Jobs left `running` (the service stopped under them): mark each interrupted and queue it again,
    or fail it once it has been interrupted more than `max_interruptions` times. A clean shutdown does not
    count (`counts=False`): only a stop nobody asked for might be the job's own doing. Returns their ids."""
    with Session(engine) as session:
        jobs = session.exec(select(Job).where(Job.status == JobStatus.running.value).order_by(col(Job.id))).all()
        for job in jobs:
            _interrupt(session, job, reason, max_interruptions, counts)
        session.commit()
        return [row_id(job) for job in jobs]


def requeue_lost(engine: Engine, job_id: int, *, max_interruptions: int, reason: str) -> bool:
    """The step running on a cluster node was lost (the node died): queue the job again, or fail it once it has
    been interrupted more than `max_interruptions` times. True when it was queued again."""
    with Session(engine) as session:
        job = session.get(Job, job_id)
        if job is None or job.status != JobStatus.running.value:
            return False
        queued = _interrupt(session, job, reason, max_interruptions, counts=True)
        session.commit()
        return queued


OUTSIDE_KILL = "outside_kill"
"""the cause of an interruption whose worker a signal from outside the job killed (JobEvent data `cause`)"""


def requeue_killed(engine: Engine, job_id: int, *, reason: str) -> bool:
    """The running step's worker was killed from outside the job (an operator, the host's OOM killer): queue the job
    again, as after a service kill, once. False when it was queued again for a kill before (a second kill is the
    step's verdict) or is no longer running."""
    with Session(engine) as session:
        job = session.get(Job, job_id)
        if job is None or job.status != JobStatus.running.value:
            return False
        earlier = session.exec(select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.type == "interrupted")).all()
        if any(event.data.get("cause") == OUTSIDE_KILL for event in earlier):
            return False
        queued = _interrupt(session, job, reason, job.interruptions + 1, counts=True, cause=OUTSIDE_KILL)
        session.commit()
        return queued


def _interrupt(
    session: Session, job: Job, reason: str, max_interruptions: int, counts: bool, cause: str = "service"
) -> bool:
    step, lane = job.steps[job.step_index], job.lane
    if job.cancel_requested_at is not None:  # its cancel was asked: it ends, never to run again
        cancel.end(session, job, f"cancelled: its {step} step on lane {lane} ended with it ({reason}); not run again")
        return False
    job.interruptions += 1 if counts else 0
    stamp = utcnow().strftime("%Y-%m-%d %H:%M:%S UTC")
    line = f"{stamp}: interrupted ({reason}) during step {step} on lane {lane}"
    add_event(
        session,
        row_id(job),
        "interrupted",
        step=step,
        lane=lane,
        reason=reason,
        interruptions=job.interruptions,
        cause=cause,
    )
    if job.interruptions > max_interruptions:
        job.note = (job.note + "\n" if job.note else "") + line
        _fail(
            session,
            job,
            f"not queued again: interrupted {job.interruptions} times "
            f"(more than KERNELLOOP_MAX_JOB_INTERRUPTIONS={max_interruptions})",
        )
        return False
    job.note = (job.note + "\n" if job.note else "") + line + "; queued again"
    job.status, job.lane, job.updated_at = JobStatus.queued, None, utcnow()
    session.add(job)
    session.flush()
    add_event(session, row_id(job), "requeued", step=step, queue_position=queue_position(session, job))
    return True


def queue_position(session: Session, job: Job) -> int | None:
    if job.status != JobStatus.queued.value:
        return None
    ahead = session.exec(
        select(func.count())
        .select_from(Job)
        .where(Job.status == JobStatus.queued.value, Job.needs == job.needs, col(Job.id) < job.id)
    ).one()
    return ahead + 1


def queue_depth(session: Session) -> dict[str, int]:
    """Queued jobs per lane kind, and running jobs."""
    rows = session.exec(
        select(Job.status, Job.needs, func.count())
        .where(col(Job.status).in_([JobStatus.queued.value, JobStatus.running.value]))
        .group_by(Job.status, Job.needs)
    ).all()
    depth = {"cpu": 0, "gpu": 0, "running": 0}
    for status, needs, count in rows:
        if status == JobStatus.running.value:
            depth["running"] += count
        else:
            depth[needs] += count
    return depth


def events_after(session: Session, job_id: int, after: int = 0) -> list[JobEvent]:
    return list(
        session.exec(
            select(JobEvent).where(JobEvent.job_id == job_id, col(JobEvent.id) > after).order_by(col(JobEvent.id))
        ).all()
    )


def job_public(session: Session, job: Job, *, reused_attempt: bool = False) -> JobPublic:
    attempt = session.get(Attempt, job.attempt_id)
    assert attempt is not None
    problem = session.get(Problem, attempt.problem_id)
    assert problem is not None
    evaluations = session.exec(
        select(Evaluation.result).where(Evaluation.job_id == job.id).order_by(col(Evaluation.id))
    ).all()
    results = [parse_result(r) for r in evaluations]
    spec = spec_of(problem)
    verdicts = [counted(spec, result) for result in results]
    return JobPublic(
        **same_named(job, JobPublic),
        run_id=attempt.run_id,
        problem=problem.name,
        backend=attempt.backend,
        queue_position=queue_position(session, job),
        reused_attempt=reused_attempt,
        results=results,
        coverage=[v.coverage for v in verdicts if v.coverage is not None],
        correct=next((v.correct for v in reversed(verdicts) if v.correct is not None), None),
        speedup=next((v.speedup for v in reversed(verdicts) if v.speedup is not None), None),
        attempt_speedup=estimate_of(attempt),
        current=_current_step(session, job),
        links=JobLinks(
            self=f"/v1/jobs/{job.id}", events=f"/v1/jobs/{job.id}/events", attempt=f"/v1/attempts/{job.attempt_id}"
        ),
    )


def _current_step(session: Session, job: Job) -> StepProgress | None:
    """A running job's step, from its last `started` event and the progress reported since."""
    if job.status != JobStatus.running.value:
        return None
    latest = (
        select(JobEvent).where(JobEvent.job_id == job.id).order_by(col(JobEvent.id).desc()).limit(1)
    )  # fmt: skip
    started = session.exec(latest.where(JobEvent.type == "started")).first()
    if started is None:
        return None
    progress = session.exec(latest.where(JobEvent.type == "progress", col(JobEvent.id) > row_id(started))).first()
    message = str(progress.data.get("message") or "") if progress is not None else ""
    return StepProgress(
        step=job.steps[job.step_index],
        elapsed_s=round((utcnow() - started.created_at).total_seconds(), 1),
        message=message or "starting the sandboxed worker, building and importing the submission",
    )


def list_jobs(
    session: Session, *, status: JobStatus | None = None, limit: int = 50, offset: int = 0
) -> tuple[list[Job], int]:
    query = select(Job)
    if status is not None:
        query = query.where(Job.status == status.value)
    total = session.exec(select(func.count()).select_from(query.subquery())).one()
    jobs = session.exec(query.order_by(col(Job.id).desc()).limit(limit).offset(offset)).all()
    return list(jobs), total


def open_jobs_of_run(session: Session, run_id: int) -> list[Job]:
    """The run's queued and running jobs, oldest first: what a page following the run shows as under way."""
    query = (
        select(Job)
        .join(Attempt, col(Attempt.id) == col(Job.attempt_id))
        .where(Attempt.run_id == run_id, col(Job.status).in_([JobStatus.queued.value, JobStatus.running.value]))
    )
    return list(session.exec(query.order_by(col(Job.id))).all())


def running_jobs_by_lane(session: Session) -> dict[str, int]:
    running = session.exec(select(Job).where(Job.status == JobStatus.running.value)).all()
    return {job.lane: row_id(job) for job in running if job.lane}
