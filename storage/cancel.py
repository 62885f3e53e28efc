"""A job's cancel, kept in the database so that no restart undoes it.

A queued job ends `cancelled` at once. For a running one the request itself is stored first
(`cancel_requested_at`, a note, a `cancel_requested` event), then the lane stops its step and ends it
(`end_stopped`). Everything that would start a step of the job, or queue it again, reads that request first and
ends the job instead: the queue's claim, the queueing of its next step, the recovery of jobs a stopped service
left running. So a cancel asked just before the service is killed still holds after the restart.

The steps that finished keep their verdicts; the one that was stopped has none. The attempt, pending while its
job waited, goes back to its latest verdict (or `cancelled` when it has none).
"""

from __future__ import annotations

from typing import Literal

from sqlalchemy import Engine, update
from sqlmodel import Session, col, select

from kernelloop.contract import TERMINAL_JOB_STATUSES, JobStatus, utcnow
from kernelloop.storage.models import Attempt, Evaluation, Job, JobEvent, row_id
from kernelloop.tools.results import Status

Asked = Literal["cancelled", "asked", "ended"]
"""What a cancel found: a queued job (now cancelled), a running one (its cancel stored), one that had ended."""


def request(engine: Engine, job_id: int, client: str) -> Asked:
    """Cancel a queued job now, or store the cancel of a running one (committed before this returns)."""
    with Session(engine) as session:
        for _ in range(10):  # a step may end between the two conditional updates: look again
            if end_if_queued(session, job_id, f"cancelled by {client} before its next step ran"):
                return "cancelled"
            now = utcnow()
            asked = session.exec(
                update(Job)
                .where(col(Job.id) == job_id, col(Job.status) == JobStatus.running.value)
                .values(cancel_requested_at=now, updated_at=now)
            )
            if asked.rowcount == 1:
                job = session.get(Job, job_id)
                assert job is not None
                _note(job, f"cancel asked by {client}: its running step is stopped")
                session.add(job)
                session.add(JobEvent(job_id=job_id, type="cancel_requested", data={"client": client}))
                session.commit()
                return "asked"
            session.rollback()
            job = session.get(Job, job_id, populate_existing=True)
            if job is None or job.status in TERMINAL_JOB_STATUSES:
                return "ended"
    return "ended"


def end_if_queued(session: Session, job_id: int, note: str) -> bool:
    """End the job `cancelled` if it is waiting for a lane (never one a lane has just claimed); commits. True
    when it was."""
    return _end_if(session, job_id, JobStatus.queued, note)


def end_stopped(engine: Engine, job_id: int, step: str, seconds: float) -> bool:
    """The lane stopped the running step of a cancelled job: end the job. False when it was not running."""
    note = f"cancelled: its {step} step was stopped after {seconds:.1f} s and has no verdict"
    with Session(engine) as session:
        return _end_if(session, job_id, JobStatus.running, note)


def _end_if(session: Session, job_id: int, status: JobStatus, note: str) -> bool:
    """End the job `cancelled` if it still has `status` (one conditional update: no lane can slip in); commits."""
    still = (col(Job.id) == job_id, col(Job.status) == status.value)
    ended = session.exec(update(Job).where(*still).values(status=JobStatus.cancelled.value))
    if ended.rowcount != 1:
        session.rollback()
        return False
    job = session.get(Job, job_id, populate_existing=True)
    assert job is not None
    end(session, job, note)
    session.commit()
    return True


def end(session: Session, job: Job, note: str) -> None:
    """End the job `cancelled` in this session (the caller commits)."""
    now = utcnow()
    job.status, job.finished_at, job.updated_at, job.lane = JobStatus.cancelled, now, now, None
    job.cancel_requested_at = job.cancel_requested_at or now
    _note(job, note)
    session.add(job)
    attempt = session.get(Attempt, job.attempt_id)
    if attempt is not None and attempt.status == "pending":
        latest = session.exec(
            select(Evaluation.status).where(Evaluation.attempt_id == job.attempt_id).order_by(col(Evaluation.id).desc())
        ).first()
        attempt.status, attempt.updated_at = (Status(latest).value if latest is not None else "cancelled"), now
        session.add(attempt)
    session.add(JobEvent(job_id=row_id(job), type="cancelled", data={"note": note}))


def asked_among(engine: Engine, job_ids: list[int]) -> list[int]:
    """Those of these running jobs whose cancel was asked (by this service or another on the same database)."""
    if not job_ids:
        return []
    with Session(engine) as session:
        rows = session.exec(
            select(Job.id).where(
                col(Job.id).in_(job_ids),
                col(Job.status) == JobStatus.running.value,
                col(Job.cancel_requested_at).is_not(None),
            )
        ).all()
        return [job_id for job_id in rows if job_id is not None]


def _note(job: Job, line: str) -> None:
    job.note = (job.note + "\n" if job.note else "") + line
