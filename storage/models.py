"""The database tables, and nothing else.

Each table extends the `...Base` of `kernelloop.contract` that holds the columns a client may see or send,
so a column's meaning is written once; the public shapes live there too. Tool results are stored as the
JSON of `kernelloop.tools.results` models and come back out as those same models.

Tables: problems, runs (one agent session), code (stored once by sha256), attempts (one submission:
its run, parent, step, proposer and rationale, plus a summary of its evaluations for fast queries),
evaluations (one compile, test or benchmark verdict with the full result), measurements (one per benchmark
that timed: appended, never replaced; an attempt's speedup is a statistic over them), jobs (the queue),
job events (what `GET /v1/jobs/{id}/events` streams), idempotency keys (a retried tool call's job), suites with
their entries (a set of problems and one solution each, scored as KernelBench scores them), and duels (two attempts
re-timed back to back, tools.duel: a confirmed one lets the challenger replace the incumbent as the best).
"""

from datetime import UTC, datetime
from typing import Any, Literal, Protocol

from pydantic import BaseModel
from sqlalchemy import JSON, DateTime, Index, Text
from sqlalchemy.types import TypeDecorator
from sqlmodel import Field, SQLModel

from kernelloop.contract import (
    ATTEMPT_CORRECT,
    ATTEMPT_MEASUREMENTS,
    ATTEMPT_SPEEDUP,
    ATTEMPT_SPEEDUP_HIGH,
    ATTEMPT_SPEEDUP_LOW,
    PROBLEM_FILE_NAME,
    RUN_COMMIT,
    RUN_VERSION,
    STEP,
    AttemptBase,
    DuelBase,
    EvaluationBase,
    JobStatus,
    LaneKind,
    MeasurementBase,
    RunBase,
    RunStatus,
    utcnow,
)
from kernelloop.tools.phase_registry import JobPhase, Phase
from kernelloop.tools.problems import MAX_PROBLEM_NAME_CHARS

SCHEMA_VERSION = 8
"""Bumped with every change to the tables or to what their columns mean; storage.database upgrades or refuses
older databases (v2: an attempt's `correct` and `speedup` count only full-coverage verdicts; v3: suites; v4: a
problem's name up to MAX_PROBLEM_NAME_CHARS, and the name of the file it was registered from; v5: a job's
cancel request, and the idempotency keys of tool calls; v6: the mode (infer, train) of each attempt and
evaluation, and an attempt's identity within a run includes its mode; v7: measurements, one row per benchmark,
appended; an attempt's speedup is the median of its counted ones with an interval; a job's step; a run's version
and commit; v8: duels, and the best is decided by the intervals and the confirmed duels)."""


class _Row(Protocol):
    id: int | None


def row_id(row: _Row) -> int:
    """The id of a row the database has numbered (added and flushed, or read back)."""
    if row.id is None:
        raise ValueError(f"{type(row).__name__} has no id yet: flush the session first")
    return row.id


def same_named(source: BaseModel, model: type[BaseModel]) -> dict[str, Any]:
    """The values of `source`'s fields that `model` has a field of the same name for: what a row takes from its
    request, or a public model from its row, as it is, so a field added to both needs no line at each copy (the
    caller adds what is worked out; a name it gives again is a TypeError, never a silent override)."""
    return {name: getattr(source, name) for name in model.model_fields if name in type(source).model_fields}


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp stored as UTC and read back timezone-aware (SQLite forgets the zone)."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is not None:
            value = value.astimezone(UTC).replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value


def _created() -> Any:
    return Field(default_factory=utcnow, sa_type=UTCDateTime, index=True)


def _timestamp() -> Any:
    return Field(default=None, sa_type=UTCDateTime)


# ------------------------------------------------------------------------------------------ schema


class SchemaInfo(SQLModel, table=True):
    """One row: the schema version the database was written with."""

    __tablename__ = "kernelloop_schema"
    id: int = Field(default=1, primary_key=True)
    version: int
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    upgraded_at: datetime | None = _timestamp()


# ---------------------------------------------------------------------------------------- problems


class Problem(SQLModel, table=True):
    """A reference problem: shipped with kernelloop, or registered over HTTP after a sandboxed check."""

    __tablename__ = "problems"
    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(index=True, unique=True, max_length=MAX_PROBLEM_NAME_CHARS)
    file_name: str | None = Field(default=None, sa_type=Text, description=PROBLEM_FILE_NAME)
    origin: Literal["shipped", "registered"] = Field(sa_type=Text)
    sha256: str = Field(max_length=64)
    source: str = Field(sa_type=Text)
    path: str = Field(sa_type=Text, description="the file sandboxed workers import")
    spec: dict[str, Any] = Field(default_factory=dict, sa_type=JSON, description="tools.problems.ProblemSpec as JSON")
    created_at: datetime = _created()
    updated_at: datetime | None = _timestamp()


# -------------------------------------------------------------------------------------------- runs


class Run(RunBase, table=True):
    """One agent session (or any group of attempts a client wants kept together)."""

    __tablename__ = "runs"
    id: int | None = Field(default=None, primary_key=True)
    problem_id: int = Field(foreign_key="problems.id", index=True)
    status: RunStatus = Field(default=RunStatus.active, sa_type=Text)
    config: dict[str, Any] = Field(default_factory=dict, sa_type=JSON)
    meta: dict[str, Any] = Field(default_factory=dict, sa_type=JSON, description="counters a client keeps, e.g. tokens")
    version: str | None = Field(default=None, description=RUN_VERSION)
    source_commit: str | None = Field(default=None, description=RUN_COMMIT)
    created_at: datetime = _created()
    updated_at: datetime | None = _timestamp()
    finished_at: datetime | None = _timestamp()


# ---------------------------------------------------------------------------------------- attempts


class CodeBlob(SQLModel, table=True):
    """Submitted source, stored once however often it is submitted."""

    __tablename__ = "code"
    sha256: str = Field(primary_key=True, max_length=64)
    text: str = Field(sa_type=Text)
    size_bytes: int
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class Attempt(AttemptBase, table=True):
    """One submission of code for one problem. The summary columns reflect its evaluations."""

    __tablename__ = "attempts"
    __table_args__ = (
        Index("ix_attempts_problem_status", "problem_id", "status"),
        Index("ix_attempts_problem_speedup", "problem_id", "speedup"),
        # within a run, one code on one backend in one mode is one attempt (NULL run ids never collide)
        Index("ux_attempts_run_code_backend_mode", "run_id", "code_sha256", "backend", "mode", unique=True),
    )
    id: int | None = Field(default=None, primary_key=True)
    problem_id: int = Field(foreign_key="problems.id", index=True)
    code_sha256: str = Field(foreign_key="code.sha256", max_length=64)
    client: str = Field(default="", max_length=200, description="where the submission came from")
    created_at: datetime = _created()
    updated_at: datetime | None = _timestamp()
    # summary of the evaluations, kept up to date by storage.history.record_evaluation
    status: str = Field(default="pending", index=True)
    stage: str | None = Field(default=None, description="the phase of the latest evaluation")
    compiled: bool | None = None
    correct: bool | None = Field(default=None, description=ATTEMPT_CORRECT)
    speedup: float | None = Field(default=None, index=True, description=ATTEMPT_SPEEDUP)
    speedup_low: float | None = Field(default=None, description=ATTEMPT_SPEEDUP_LOW)
    speedup_high: float | None = Field(default=None, description=ATTEMPT_SPEEDUP_HIGH)
    measurements: int = Field(default=0, description=ATTEMPT_MEASUREMENTS)
    device: str | None = None


class Evaluation(EvaluationBase, table=True):
    """One compile, test or benchmark verdict on an attempt."""

    __tablename__ = "evaluations"
    id: int | None = Field(default=None, primary_key=True)
    attempt_id: int = Field(foreign_key="attempts.id", index=True)
    job_id: int | None = Field(default=None, foreign_key="jobs.id", index=True)
    result: dict[str, Any] = Field(default_factory=dict, sa_type=JSON, description="the tool's full result")
    log: str = Field(default="", sa_type=Text, description="build log and the worker's output, capped")
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime, description="when the job was queued")
    started_at: datetime | None = _timestamp()
    finished_at: datetime | None = _timestamp()


class Measurement(MeasurementBase, table=True):
    """One benchmark of an attempt that timed (storage.history.record_evaluation appends it; nothing replaces it)."""

    __tablename__ = "measurements"
    id: int | None = Field(default=None, primary_key=True)
    attempt_id: int = Field(foreign_key="attempts.id", index=True)
    evaluation_id: int = Field(foreign_key="evaluations.id", unique=True)
    job_id: int | None = Field(default=None, foreign_key="jobs.id")
    measured_at: datetime = Field(sa_type=UTCDateTime)
    shapes: list[dict[str, Any]] = Field(
        default_factory=list, sa_type=JSON, description="contract.ShapeMeasurement per benchmark shape, as JSON"
    )


class Duel(DuelBase, table=True):
    """Two attempts re-timed back to back (server.duel runs it, tools.duel decides it); each benchmark of it is also
    a measurement of its attempt."""

    __tablename__ = "duels"
    id: int | None = Field(default=None, primary_key=True)
    challenger_attempt_id: int = Field(foreign_key="attempts.id", index=True)
    incumbent_attempt_id: int = Field(foreign_key="attempts.id", index=True)
    rounds: list[dict[str, Any]] = Field(
        default_factory=list, sa_type=JSON, description="tools.duel.DuelRound per round tried, as JSON"
    )
    client: str = Field(default="", max_length=200)
    created_at: datetime = _created()
    finished_at: datetime | None = _timestamp()


# -------------------------------------------------------------------------------------------- jobs


class Job(SQLModel, table=True):
    """A queued request to evaluate an attempt: one or more steps, each run on a CPU or a GPU lane."""

    __tablename__ = "jobs"
    __table_args__ = (Index("ix_jobs_queue", "status", "needs", "id"),)
    id: int | None = Field(default=None, primary_key=True)
    attempt_id: int = Field(foreign_key="attempts.id", index=True)
    phase: JobPhase = Field(sa_type=Text)
    steps: list[Phase] = Field(default_factory=list, sa_type=JSON, description="the phases to run, in order")
    step_index: int = 0
    needs: LaneKind = Field(default="cpu", sa_type=Text, description="the lane kind the next step runs on")
    status: JobStatus = Field(default=JobStatus.queued, sa_type=Text)
    lane: str | None = Field(default=None, description="the lane running it, e.g. cpu-0 or gpu-1")
    options: dict[str, Any] = Field(default_factory=dict, sa_type=JSON)
    outcome: str | None = Field(default=None, description="the status of the last step that ran")
    note: str = Field(default="", sa_type=Text, description="interruptions and harness errors, for people")
    interruptions: int = 0
    client: str = Field(default="", max_length=200)
    run_step: int | None = Field(default=None, description=STEP)
    created_at: datetime = _created()
    started_at: datetime | None = _timestamp()
    finished_at: datetime | None = _timestamp()
    updated_at: datetime | None = _timestamp()
    cancel_requested_at: datetime | None = Field(
        default=None, sa_type=UTCDateTime, description="a client asked to cancel it: no step of it starts again"
    )


class JobEvent(SQLModel, table=True):
    """One thing that happened to a job; the id orders the SSE stream and serves as Last-Event-ID."""

    __tablename__ = "job_events"
    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="jobs.id", index=True)
    type: str = Field(
        description="queued, started, progress, step_finished, interrupted, requeued, cancel_requested, "
        "finished, failed, cancelled"
    )
    data: dict[str, Any] = Field(default_factory=dict, sa_type=JSON)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class IdempotencyKey(SQLModel, table=True):
    """A tool call's Idempotency-Key: a retry with the same key (and the same request) gets this job back."""

    __tablename__ = "idempotency_keys"
    __table_args__ = (Index("ux_idempotency_keys_scope_key", "scope", "key", unique=True),)
    id: int | None = Field(default=None, primary_key=True)
    scope: str = Field(max_length=200, description="whose key: a digest of the bearer token, else the address")
    key: str = Field(max_length=255)
    request_sha256: str = Field(max_length=64, description="the tool and its body, canonical JSON")
    job_id: int = Field(foreign_key="jobs.id")
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


# ------------------------------------------------------------------------------------------ suites


class Suite(SQLModel, table=True):
    """A set of problems, each with at most one solution, evaluated together (`kernelloop suite`)."""

    __tablename__ = "suites"
    id: int | None = Field(default=None, primary_key=True)
    name: str | None = Field(default=None, max_length=200)
    backend: str = Field(sa_type=Text)
    policy: str | None = Field(default=None, sa_type=Text)
    client: str = Field(default="", max_length=200)
    created_at: datetime = _created()


class SuiteEntry(SQLModel, table=True):
    """One problem of a suite: its level, and the attempt its solution became (none without a solution, or
    when the submission was refused: `note` says why)."""

    __tablename__ = "suite_entries"
    id: int | None = Field(default=None, primary_key=True)
    suite_id: int = Field(foreign_key="suites.id", index=True)
    problem_id: int = Field(foreign_key="problems.id")
    level: str = Field(max_length=64)
    solution: str | None = Field(default=None, sa_type=Text)
    attempt_id: int | None = Field(default=None, foreign_key="attempts.id")
    job_id: int | None = Field(default=None, foreign_key="jobs.id")
    note: str = Field(default="", sa_type=Text)
