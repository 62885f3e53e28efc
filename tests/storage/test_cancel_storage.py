"""storage/: a cancel kept in the database, on real SQLite files (and PostgreSQL with
KERNELLOOP_TEST_DATABASE_URL): a cancel stored while a step runs ends the job at every place that would run it
again (the recovery of jobs left running at start-up, the queueing of its next step, a claim), and the upgrade
to v5 adds the cancel's column and the idempotency keys to an older database, keeping its jobs."""

from __future__ import annotations

import random
from pathlib import Path

import test_storage
from sqlalchemy import inspect, text
from sqlmodel import Session, select
from test_storage import _attempt, _compiled

from kernelloop.contract import JobStatus
from kernelloop.storage import cancel, problems, queue
from kernelloop.storage.database import database_url, open_database
from kernelloop.storage.models import SCHEMA_VERSION, Attempt, Job, JobEvent, SchemaInfo, utcnow
from kernelloop.tools.jobs import EvalOptions

engine = test_storage.engine  # the fixture: on SQLite, and on PostgreSQL with KERNELLOOP_TEST_DATABASE_URL


def _running_job(engine_, phase: str = "evaluate") -> tuple[int, int]:  # type: ignore[no-untyped-def]
    """A job a lane has claimed: (job id, attempt id)."""
    with Session(engine_) as session:
        attempt, _ = _attempt(session, code=f"# {random.random()}")
        job = queue.enqueue(session, attempt, phase, EvalOptions(), "test")  # type: ignore[arg-type]
        ids = (job.id, attempt.id)
    assert queue.claim_next(engine_, "cpu", "cpu-0") == ids[0]
    return ids  # type: ignore[return-value]


def _row(engine_, job_id: int) -> tuple[Job, list[str], str]:  # type: ignore[no-untyped-def]
    with Session(engine_) as session:
        job = session.get(Job, job_id)
        assert job is not None
        events = [e.type for e in session.exec(select(JobEvent).where(JobEvent.job_id == job_id)).all()]
        attempt = session.get(Attempt, job.attempt_id)
        assert attempt is not None
        return job, events, attempt.status


def test_a_cancel_stored_while_the_service_died_is_kept_at_the_restart(engine) -> None:
    job_id, _ = _running_job(engine)
    assert cancel.request(engine, job_id, "127.0.0.1") == "asked"
    # the service is killed before its lane could end the job; the next start-up recovers what was left running
    assert queue.requeue_running(engine, max_interruptions=1, reason="the service stopped while it ran") == [job_id]
    job, events, attempt_status = _row(engine, job_id)
    assert job.status == JobStatus.cancelled.value and job.interruptions == 0 and job.finished_at is not None
    assert "requeued" not in events and events[-2:] == ["cancel_requested", "cancelled"], events
    assert "not run again" in job.note and attempt_status == "cancelled"
    assert queue.claim_next(engine, "cpu", "cpu-0") is None  # no lane ever gets it
    assert cancel.request(engine, job_id, "127.0.0.1") == "ended"


def test_a_cancel_stored_while_a_step_ran_keeps_its_verdict_and_queues_no_next_step(engine) -> None:
    job_id, attempt_id = _running_job(engine)
    assert cancel.request(engine, job_id, "another service") == "asked"
    now = utcnow()
    job = queue.finish_step(engine, job_id, _compiled(), started_at=now, finished_at=now)
    assert (job.status, job.step_index) == (JobStatus.cancelled.value, 0), (job.status, job.note)
    _, events, attempt_status = _row(engine, job_id)
    assert events[-2:] == ["step_finished", "cancelled"] and "queued" not in events[1:], events
    assert attempt_status == "passed"  # the compile's verdict stands
    assert queue.claim_next(engine, "cpu", "cpu-0") is None


def test_a_job_queued_again_after_its_cancel_is_ended_by_the_claim_not_run(engine) -> None:
    job_id, _ = _running_job(engine)
    assert cancel.request(engine, job_id, "127.0.0.1") == "asked"
    with engine.begin() as connection:  # a step that ended just as the cancel was stored, and queued the next
        connection.execute(text("UPDATE jobs SET status = 'queued' WHERE id = :id"), {"id": job_id})
    assert queue.claim_next(engine, "cpu", "cpu-1") is None
    job, events, _ = _row(engine, job_id)
    assert job.status == JobStatus.cancelled.value and "started" not in events[2:], events


def test_a_queued_job_is_cancelled_at_once(engine) -> None:
    with Session(engine) as session:
        attempt, _ = _attempt(session, code=f"# {random.random()}")
        job_id = queue.enqueue(session, attempt, "compile", EvalOptions(), "test").id
    assert cancel.request(engine, job_id, "127.0.0.1") == "cancelled"
    job, events, attempt_status = _row(engine, job_id)
    assert job.status == JobStatus.cancelled.value and events == ["queued", "cancelled"]
    assert "cancelled by 127.0.0.1" in job.note and attempt_status == "cancelled"


def test_the_upgrade_to_v5_adds_the_cancel_and_the_keys_and_keeps_the_jobs(tmp_path: Path) -> None:
    path = tmp_path / "v4.sqlite3"
    engine_ = open_database(database_url(str(path)))
    with Session(engine_) as session:
        problems.sync_shipped(session)
    job_id, _ = _running_job(engine_, "compile")
    with engine_.begin() as connection:  # the tables as v4 wrote them
        connection.execute(text("ALTER TABLE jobs DROP COLUMN cancel_requested_at"))
        connection.execute(text("DROP TABLE idempotency_keys"))
        connection.execute(text("UPDATE kernelloop_schema SET version = 4"))
    engine_.dispose()

    engine_ = open_database(database_url(str(path)))  # as a new kernelloop opens it
    assert "idempotency_keys" in inspect(engine_).get_table_names()
    with Session(engine_) as session:
        assert session.exec(select(SchemaInfo)).one().version == SCHEMA_VERSION  # v5, and on to the latest
        job = session.get(Job, job_id)
        assert job is not None and job.status == JobStatus.running.value and job.cancel_requested_at is None
    assert cancel.request(engine_, job_id, "127.0.0.1") == "asked"
    assert _row(engine_, job_id)[0].cancel_requested_at is not None
    engine_.dispose()
