"""The database tables and the API's schemas, side by side.

Each table has a `...Base` with the columns a client may see or send, the table class itself, and the
public shapes built from the same fields, so a column's meaning is written once. Tool results are
stored as the JSON of `tools.results` models and come back out as those same models.

Tables: problems, runs (one agent session), code (stored once by sha256), attempts (one submission:
its run, parent, step, proposer and rationale, plus a summary of its evaluations for fast queries),
evaluations (one compile, test or benchmark verdict with the full result), jobs (the queue) and
job events (what `GET /v1/jobs/{id}/events` streams).
"""

import enum
from datetime import UTC, datetime
from typing import Any, Generic, Literal, TypeVar

from pydantic import AliasChoices, BaseModel, ConfigDict, field_validator
from pydantic import Field as PydanticField
from sqlalchemy import JSON, DateTime, Index, Text
from sqlalchemy.types import TypeDecorator
from sqlmodel import Field, SQLModel

from kernelloop.tools.jobs import EvalOptions
from kernelloop.tools.problems import ShapeSpec
from kernelloop.tools.results import Backend, PhaseResultAny, Status, TolerancePolicy

SCHEMA_VERSION = 2
"""Bumped with every change to the tables or to what their columns mean; storage.database upgrades or refuses
older databases (v2: an attempt's `correct` and `speedup` count only full-coverage verdicts)."""
MAX_ID = 2**63 - 1  # the largest id a database integer holds


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator):
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


# --------------------------------------------------------------------------------------------- enums

Phase = Literal["compile", "test", "benchmark"]
JobPhase = Literal["compile", "test", "benchmark", "evaluate"]
LaneKind = Literal["cpu", "gpu"]


class JobStatus(str, enum.Enum):
    queued = "queued"  # waiting for a lane (also after an interruption: see `interruptions`)
    running = "running"
    finished = "finished"  # every step ran, or one failed and the rest were skipped: see `outcome`
    failed = "failed"  # the service could not run it (harness error, or interrupted too often): see `note`


TERMINAL_JOB_STATUSES = {JobStatus.finished, JobStatus.failed}

AttemptStatus = enum.Enum(  # type: ignore[misc]
    "AttemptStatus", {"pending": "pending", "failed": "failed", **{s.name: s.value for s in Status}}, type=str
)
AttemptStatus.__doc__ = ("An attempt's latest outcome: a tool Status, `pending` while a job on it is queued or "
                         "running, `failed` when the service could not evaluate it.")


class RunStatus(str, enum.Enum):
    active = "active"
    finished = "finished"
    interrupted = "interrupted"
    failed = "failed"


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
    name: str = Field(index=True, unique=True, max_length=64)
    origin: Literal["shipped", "registered"] = Field(sa_type=Text)
    sha256: str = Field(max_length=64)
    source: str = Field(sa_type=Text)
    path: str = Field(sa_type=Text, description="the file sandboxed workers import")
    spec: dict = Field(default_factory=dict, sa_type=JSON, description="tools.problems.ProblemSpec as JSON")
    created_at: datetime = _created()
    updated_at: datetime | None = _timestamp()


class ProblemCreate(BaseModel):
    """A KernelBench-format file to register: Model, get_inputs, get_init_inputs, optional metadata."""

    name: str = PydanticField(pattern=r"^[a-z][a-z0-9_]{0,63}$", description="lower-case identifier, e.g. my_softmax")
    source: str = PydanticField(min_length=1, description="the Python source of the problem file")


class ProblemSummary(BaseModel):
    name: str
    origin: Literal["shipped", "registered"]
    dtype: str
    tolerance: TolerancePolicy
    correctness_shapes: int
    benchmark_shapes: int
    sha256: str
    created_at: datetime


class ProblemDetail(ProblemSummary):
    source: str
    forbidden_ops: list[str]
    has_metadata: bool
    shapes: list[ShapeSpec] = PydanticField(description="constructor arguments, input sizes, FLOP and byte counts")


# -------------------------------------------------------------------------------------------- runs

class RunBase(SQLModel):
    name: str | None = Field(default=None, max_length=200, description="a label for people")
    proposer: str | None = Field(default=None, max_length=200, description="e.g. llm, search, replay, human")
    model: str | None = Field(default=None, max_length=200, description="the language model, if any")
    backend: Backend | None = Field(default=None, sa_type=Text)
    notes: str | None = Field(default=None, sa_type=Text)


class Run(RunBase, table=True):
    """One agent session (or any group of attempts a client wants kept together)."""

    __tablename__ = "runs"
    id: int | None = Field(default=None, primary_key=True)
    problem_id: int = Field(foreign_key="problems.id", index=True)
    status: RunStatus = Field(default=RunStatus.active, sa_type=Text)
    config: dict = Field(default_factory=dict, sa_type=JSON)
    meta: dict = Field(default_factory=dict, sa_type=JSON, description="counters a client keeps, e.g. tokens")
    created_at: datetime = _created()
    updated_at: datetime | None = _timestamp()
    finished_at: datetime | None = _timestamp()


class RunCreate(RunBase):
    problem: str = Field(min_length=1, description="problem name, see GET /v1/problems")
    config: dict[str, Any] = Field(default_factory=dict, description="the run's settings, kept as given")


class RunUpdate(SQLModel):
    status: RunStatus | None = None
    notes: str | None = None
    meta: dict[str, Any] | None = Field(default=None, description="merged into the run's meta (keys replaced)")


class RunPublic(RunBase):
    id: int
    problem: str
    status: RunStatus
    config: dict[str, Any]
    meta: dict[str, Any]
    created_at: datetime
    updated_at: datetime | None
    finished_at: datetime | None
    attempts: int = 0
    best_attempt_id: int | None = None
    best_speedup: float | None = None


# ---------------------------------------------------------------------------------------- attempts

class CodeBlob(SQLModel, table=True):
    """Submitted source, stored once however often it is submitted."""

    __tablename__ = "code"
    sha256: str = Field(primary_key=True, max_length=64)
    text: str = Field(sa_type=Text)
    size_bytes: int
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


ATTEMPT_CORRECT = ("True: the latest counted run_tests passed on every correctness shape of the problem (on the "
                   "attempt's backend) with the default number of seeds; False: a run_tests failed; None: neither yet "
                   "(a test narrowed by options.shapes or options.seeds never sets it)")
ATTEMPT_SPEEDUP = ("geometric-mean speedup of the most recent passed benchmark that timed every benchmark shape of the "
                   "problem: a re-timing replaces it, better or worse; a benchmark narrowed by options.shapes never "
                   "sets it")


class AttemptBase(SQLModel):
    run_id: int | None = Field(default=None, foreign_key="runs.id", index=True)
    parent_id: int | None = Field(default=None, foreign_key="attempts.id", description="the attempt this one revises")
    step: int | None = Field(default=None, description="the agent's step (iteration) that proposed it")
    backend: Backend = Field(sa_type=Text)
    proposer: str = Field(default="api", max_length=200, description="who proposed it: llm:MODEL, search, human, api")
    rationale: str | None = Field(default=None, sa_type=Text, description="why it was proposed")


class Attempt(AttemptBase, table=True):
    """One submission of code for one problem. The summary columns reflect its evaluations."""

    __tablename__ = "attempts"
    __table_args__ = (
        Index("ix_attempts_problem_status", "problem_id", "status"),
        Index("ix_attempts_problem_speedup", "problem_id", "speedup"),
        # within a run, one code on one backend is one attempt (NULL run ids never collide)
        Index("ux_attempts_run_code_backend", "run_id", "code_sha256", "backend", unique=True),
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
    device: str | None = None


class AttemptSummary(AttemptBase):
    id: int
    problem: str
    code_sha256: str
    code_bytes: int
    client: str
    status: AttemptStatus
    stage: Phase | None
    compiled: bool | None
    correct: bool | None = Field(description=ATTEMPT_CORRECT)
    speedup: float | None = Field(description=ATTEMPT_SPEEDUP)
    device: str | None
    created_at: datetime
    updated_at: datetime | None


class EvaluationBase(SQLModel):
    kind: Phase = Field(sa_type=Text)
    status: Status = Field(sa_type=Text, index=True)
    message: str = Field(default="", sa_type=Text)
    backend: Backend = Field(sa_type=Text)
    device: str = ""
    isolation: str | None = None
    toolchain: dict = Field(default_factory=dict, sa_type=JSON)
    build_seconds: float | None = None
    wall_seconds: float | None = Field(default=None, description="the sandboxed worker's wall time")
    speedup: float | None = Field(default=None, description="benchmark: geometric-mean speedup over eager PyTorch")
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime, description="when the job was queued")
    started_at: datetime | None = _timestamp()
    finished_at: datetime | None = _timestamp()


class Evaluation(EvaluationBase, table=True):
    """One compile, test or benchmark verdict on an attempt."""

    __tablename__ = "evaluations"
    id: int | None = Field(default=None, primary_key=True)
    attempt_id: int = Field(foreign_key="attempts.id", index=True)
    job_id: int | None = Field(default=None, foreign_key="jobs.id", index=True)
    result: dict = Field(default_factory=dict, sa_type=JSON, description="the tool's full result")
    log: str = Field(default="", sa_type=Text, description="build log and the worker's output, capped")


class Coverage(BaseModel):
    """How much of the problem one test or benchmark covered (storage.coverage). Only full coverage counts:
    a passed test marks the attempt correct, a passed benchmark sets its speedup; a narrower one is kept,
    leaves the attempt's summary as it was, and says so in `note`."""

    phase: Literal["test", "benchmark"]
    shapes_checked: int = PydanticField(description="test: correctness shapes with a passed check; benchmark: "
                                                    "benchmark shapes timed and passed")
    shapes_required: int = PydanticField(description="the problem's shapes of that kind on the attempt's backend")
    seeds_checked: int | None = PydanticField(None, description="test: the fewest passed seeds on a checked shape")
    seeds_required: int | None = PydanticField(None, description="test: the default number of seeds")
    full: bool
    note: str = PydanticField(description="e.g. 'partial coverage: 2 of 6 correctness shapes, 1 of 3 seeds; ...'")


class EvaluationPublic(EvaluationBase):
    id: int
    attempt_id: int
    job_id: int | None
    result: PhaseResultAny
    coverage: Coverage | None = PydanticField(None, description="test, benchmark: how much of the problem it covered")
    log: str


class AttemptDetail(AttemptSummary):
    code: str
    evaluations: list[EvaluationPublic]
    jobs: list[int] = PydanticField(description="ids of the jobs that evaluated it")


class AttemptDiff(BaseModel):
    from_attempt: int
    to_attempt: int
    identical: bool
    diff: str = PydanticField(description="unified diff of the two sources")


class AttemptFilter(BaseModel):
    """Which attempts to list, in what order, and which page."""

    model_config = ConfigDict(extra="forbid")

    problem: str | None = PydanticField(None, max_length=200)
    run_id: int | None = PydanticField(None, ge=1, le=MAX_ID)
    status: AttemptStatus | None = None
    backend: Backend | None = None
    proposer: str | None = PydanticField(None, max_length=200)
    correct: bool | None = PydanticField(None, description="true: passed run_tests; false: failed it")
    min_speedup: float | None = PydanticField(None, ge=0, allow_inf_nan=False, description="only attempts at least this fast")
    sort: Literal["created", "speedup", "step", "id"] = "created"
    order: Literal["asc", "desc"] = "desc"
    limit: int = PydanticField(50, ge=1, le=500)
    offset: int = PydanticField(0, ge=0, le=MAX_ID)


class LeaderboardEntry(BaseModel):
    rank: int
    problem: str
    attempt_id: int
    run_id: int | None
    backend: Backend
    device: str | None
    speedup: float
    proposer: str
    created_at: datetime


T = TypeVar("T")


class Page(BaseModel, Generic[T]):
    items: list[T]
    total: int
    limit: int
    offset: int


# -------------------------------------------------------------------------------------------- jobs

class Job(SQLModel, table=True):
    """A queued request to evaluate an attempt: one or more steps, each run on a CPU or a GPU lane."""

    __tablename__ = "jobs"
    __table_args__ = (Index("ix_jobs_queue", "status", "needs", "id"),)
    id: int | None = Field(default=None, primary_key=True)
    attempt_id: int = Field(foreign_key="attempts.id", index=True)
    phase: JobPhase = Field(sa_type=Text)
    steps: list = Field(default_factory=list, sa_type=JSON, description="the phases to run, in order")
    step_index: int = 0
    needs: LaneKind = Field(default="cpu", sa_type=Text, description="the lane kind the next step runs on")
    status: JobStatus = Field(default=JobStatus.queued, sa_type=Text)
    lane: str | None = Field(default=None, description="the lane running it, e.g. cpu-0 or gpu-1")
    options: dict = Field(default_factory=dict, sa_type=JSON)
    outcome: str | None = Field(default=None, description="the status of the last step that ran")
    note: str = Field(default="", sa_type=Text, description="interruptions and harness errors, for people")
    interruptions: int = 0
    client: str = Field(default="", max_length=200)
    created_at: datetime = _created()
    started_at: datetime | None = _timestamp()
    finished_at: datetime | None = _timestamp()
    updated_at: datetime | None = _timestamp()


class JobEvent(SQLModel, table=True):
    """One thing that happened to a job; the id orders the SSE stream and serves as Last-Event-ID."""

    __tablename__ = "job_events"
    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="jobs.id", index=True)
    type: str = Field(description="queued, started, progress, step_finished, interrupted, requeued, finished, failed")
    data: dict = Field(default_factory=dict, sa_type=JSON)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class JobEventPublic(BaseModel):
    id: int
    job_id: int
    type: str
    data: dict[str, Any]
    created_at: datetime


class JobLinks(BaseModel):
    self: str
    events: str
    attempt: str


class JobPublic(BaseModel):
    id: int
    attempt_id: int
    run_id: int | None
    problem: str
    backend: Backend
    phase: JobPhase
    steps: list[Phase]
    step_index: int
    status: JobStatus
    queue_position: int | None = PydanticField(None, description="1 = next on its lane kind; None unless queued")
    needs: LaneKind
    lane: str | None
    outcome: AttemptStatus | None = PydanticField(None, description="status of the last step that ran")
    note: str
    interruptions: int
    reused_attempt: bool = PydanticField(False, description="the same code was already an attempt in this run")
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    results: list[PhaseResultAny] = PydanticField(description="one verdict per step that ran, in order")
    coverage: list[Coverage] = PydanticField([], description="for each test and benchmark step that ran: how much "
                                                             "of the problem it covered")
    correct: bool | None = PydanticField(None, description="what the job counts for the attempt: True from a passed "
                                                           "full-coverage test, False from a failed test, else None")
    speedup: float | None = PydanticField(None, description="the geometric-mean speedup of a passed full-coverage "
                                                            "benchmark in this job, else None")
    links: JobLinks


# ---------------------------------------------------------------------------------- tool requests

class KernelSubmission(BaseModel):
    """What a tool call carries: the kernel and what to check it against. GET /v1/tools is made from this."""

    model_config = ConfigDict(populate_by_name=True)

    problem: str = PydanticField(min_length=1, max_length=200,
                                 description="problem name, e.g. causal_conv1d (GET /v1/problems lists them)")
    code: str = PydanticField(
        min_length=1,
        validation_alias=AliasChoices("code", "kernel_code"),
        description="Python source defining `class ModelNew(nn.Module)` with the reference Model's constructor "
                    "signature; kernels usually come from torch.utils.cpp_extension.load_inline",
    )
    backend: Backend | None = PydanticField(
        None, description="cuda (tensors on the GPU) or cpu (C++ via load_inline(cpp_sources=...)); "
                          "default: cuda when the service has a GPU, else cpu")
    options: EvalOptions | None = PydanticField(
        None, description="shapes, seeds, timing budget; the defaults are strict. A test narrowed to fewer shapes or "
                          "seeds than the defaults, or a benchmark narrowed to fewer shapes, is recorded but never "
                          "counts: it neither marks the attempt correct nor sets its speedup")
    rationale: str | None = PydanticField(None, max_length=20000, description="why this kernel: kept in the history")

    @field_validator("code")
    @classmethod
    def _code_not_blank(cls, code: str) -> str:
        if not code.strip():
            raise ValueError("code is only whitespace: send the Python source that defines ModelNew")
        return code


class SubmissionRequest(KernelSubmission):
    """Body of POST /v1/compile, /v1/test, /v1/benchmark and /v1/evaluate."""

    run_id: int | None = PydanticField(None, ge=1, le=MAX_ID, description="the run (agent session) this attempt belongs to")
    parent_attempt_id: int | None = PydanticField(None, ge=1, le=MAX_ID, description="the attempt this code revises")
    step: int | None = PydanticField(None, ge=0, le=MAX_ID, description="the agent's step number")
    proposer: str = PydanticField("api", min_length=1, max_length=200,
                                  description="who proposed it, e.g. llm:gpt-5, search, human")
