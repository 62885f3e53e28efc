"""Rerun: measure an attempt again under its recorded settings (POST /v1/attempts/{id}/rerun, the MCP tool
`rerun_attempt`, `kernelloop rerun ATTEMPT`).

The new benchmark runs the attempt's own code, problem and backend with the options of the job that last measured
it (those a benchmark reads; a test's options of an evaluate job are left out), and is appended as a measurement:
its `deviation` says how far it lies from the ones recorded before it, in units of their spread.
"""

from __future__ import annotations

from sqlmodel import Session, col, select

from kernelloop.contract import JobPublic, RerunAnswer
from kernelloop.server.errors import ApiError
from kernelloop.server.reads import attempt_row
from kernelloop.server.service import Service
from kernelloop.storage import history, queue
from kernelloop.storage.models import Attempt, Job, Measurement, row_id
from kernelloop.tools.jobs import EvalOptions, inapplicable_options
from kernelloop.tools.phase_registry import steps_of


def recorded_options(session: Session, attempt: Attempt, field: str = "path.attempt_id") -> EvalOptions:
    """The options of the job that took the attempt's latest measurement, as a benchmark reads them; refused
    (422, naming `field`) for an attempt never measured."""
    job_id = session.exec(
        select(Measurement.job_id)
        .where(Measurement.attempt_id == row_id(attempt), col(Measurement.job_id).is_not(None))
        .order_by(col(Measurement.counted).desc(), col(Measurement.id).desc())
        .limit(1)
    ).first()
    job = session.get(Job, job_id) if job_id is not None else None
    if job is None:
        raise ApiError(
            422,
            "never_measured",
            f"attempt {attempt.id} has no benchmark to repeat: no job of the service timed it",
            field=field,
            fix="time it first with POST /v1/benchmark (or /v1/evaluate) of its code",
        )
    options = EvalOptions.model_validate(job.options)
    unread = inapplicable_options(options, steps_of("benchmark"))
    return options.model_copy(update={name: EvalOptions.model_fields[name].default for name in unread})


def submit_rerun(service: Service, attempt_id: int, client: str) -> tuple[JobPublic, RerunAnswer]:
    """Queue the attempt's benchmark under its recorded settings; the job, and the answer as it stands now."""
    with Session(service.engine) as session:
        attempt = attempt_row(session, attempt_id, "path.attempt_id")
        options = recorded_options(session, attempt)
        before = history.estimate_of(attempt)
        job = queue.job_public(session, queue.enqueue(session, attempt, "benchmark", options, client))
    service.scheduler.wake()
    return job, RerunAnswer(job=job, before=before)


def rerun_answer(service: Service, job: JobPublic, queued: RerunAnswer) -> RerunAnswer:
    """The answer once the job is where it is: the measurement it appended (if it has finished with one) and the
    attempt's speedup now."""
    with Session(service.engine) as session:
        return RerunAnswer.of(job, history.measurements(session, job.attempt_id), queued.before)
