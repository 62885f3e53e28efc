"""The HTTP API's contract: every request and response body of the service, in one module.

The service validates and answers with these; the agent (or any Python client) sends and reads them; the
history's tables extend the `...Base` classes, so a column's meaning is written once. Tool results are
`kernelloop.tools.results` models, and the phases and tools are those of `kernelloop.tools.phase_registry`.
Nothing here touches a database or a GPU.
"""

import enum
import json
import re
import unicodedata
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import AfterValidator, AliasChoices, BaseModel, ConfigDict, field_validator
from pydantic import Field as PydanticField
from pydantic_core import PydanticCustomError
from sqlalchemy import JSON, Text
from sqlmodel import Field, SQLModel

from kernelloop.tools.coverage import Coverage
from kernelloop.tools.duel import DUEL_ROUNDS, DuelRound, Verdict
from kernelloop.tools.jobs import EvalOptions
from kernelloop.tools.phase_registry import JobPhase, Phase
from kernelloop.tools.problems import MAX_PROBLEM_NAME_CHARS, PROBLEM_NAME_PATTERN, ShapeSpec, problem_name
from kernelloop.tools.results import Backend, Mode, PhaseResultAny, Status, Timing, TolerancePolicy
from kernelloop.tools.speedup_estimate import SpeedupEstimate

MAX_ID = 2**63 - 1  # the largest id a database integer holds
LaneKind = Literal["cpu", "gpu"]


def utcnow() -> datetime:
    return datetime.now(UTC)


def package_version() -> str:
    """The installed distribution's version: `kernelloop --version`, the API's (Health, OpenAPI), the MCP server's."""
    try:
        return version("kernelloop")
    except PackageNotFoundError:
        return "0+unknown"


# --------------------------------------------------------------------------------------------- enums


class JobStatus(str, enum.Enum):
    queued = "queued"  # waiting for a lane (also after an interruption: see `interruptions`)
    running = "running"
    finished = "finished"  # every step ran, or one failed and the rest were skipped: see `outcome`
    failed = "failed"  # the service could not run it (harness error, or interrupted too often): see `note`
    cancelled = "cancelled"  # a client cancelled it: the steps that finished keep their verdicts, see `note`


TERMINAL_JOB_STATUSES = {JobStatus.finished, JobStatus.failed, JobStatus.cancelled}

AttemptStatus = enum.Enum(  # type: ignore[misc]
    "AttemptStatus",
    {"pending": "pending", "failed": "failed", "cancelled": "cancelled", **{s.name: s.value for s in Status}},
    type=str,
)
AttemptStatus.__doc__ = (
    "An attempt's latest outcome: a tool Status, `pending` while a job on it is queued or "
    "running, `failed` when the service could not evaluate it, `cancelled` when its job was cancelled "
    "before any step gave it a verdict."
)


class RunStatus(str, enum.Enum):
    active = "active"
    finished = "finished"
    interrupted = "interrupted"
    failed = "failed"


# ---------------------------------------------------------------------------------------- problems


PROBLEM_FILE_NAME = "the name of the file the problem was registered from, e.g. 19_ReLU.py; none if not given"
MAX_FILE_NAME_CHARS = 255
# a plain file name: no folder separators or control characters, and not `.` or `..` (one character not a dot)
FILE_NAME_PATTERN = r"^[^/\\\x00-\x1f\x7f]*[^./\\\x00-\x1f\x7f][^/\\\x00-\x1f\x7f]*$"


class ProblemCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    """A KernelBench-format file to register: Model, get_inputs, get_init_inputs, optional metadata."""

    name: str = PydanticField(
        pattern=PROBLEM_NAME_PATTERN,
        description=f"up to {MAX_PROBLEM_NAME_CHARS} letters, digits and underscores, starting with a letter or digit, "
        "e.g. my_softmax or KernelBench's 19_ReLU (a file's stem that does not fit is shortened by one rule: README, "
        "Problems)",
    )
    source: str = PydanticField(min_length=1, description="the Python source of the problem file")
    file_name: str | None = PydanticField(
        None, max_length=MAX_FILE_NAME_CHARS, pattern=FILE_NAME_PATTERN, description=PROBLEM_FILE_NAME
    )

    @field_validator("name", mode="before")
    @classmethod
    def _name_fits(cls, name: Any) -> Any:
        """A name that does not fit is refused with the name the rule makes of it as the fix."""
        if isinstance(name, str) and not re.fullmatch(PROBLEM_NAME_PATTERN, name):
            raise PydanticCustomError(
                "problem_name",
                "'{name}' is not a problem name: up to {most} letters, digits and underscores, "
                "starting with a letter or digit",
                {"name": name[:300], "most": MAX_PROBLEM_NAME_CHARS, "fix": f"send the name {problem_name(name)!r}"},
            )
        return name


class ProblemSummary(BaseModel):
    name: str
    file_name: str | None = PydanticField(None, description=PROBLEM_FILE_NAME)
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
    unjudgeable: list[str] = PydanticField(
        [], description="the policies the problem's own reference cannot be judged by, shape by shape, and why"
    )


# -------------------------------------------------------------------------------------------- runs


BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
"""the characters that reorder the text around them: a name holding a right-to-left override displays as another"""


def _plain_label(label: str | None) -> str | None:
    """A label for people shows what it holds: no control character (a line break, an escape) and no bidi control
    (a right-to-left override shows `exe.txt` for `txt.exe`), each of which makes it display as something else."""
    if label is None:
        return None
    for index, char in enumerate(label):
        if char in BIDI_CONTROLS or unicodedata.category(char) == "Cc":
            raise PydanticCustomError(
                "label_character",
                "character {index} is {code} ({name}), which would make the label display as something else: "
                "send plain text without control or bidi characters",
                {"index": index, "code": f"U+{ord(char):04X}", "name": unicodedata.name(char, "a control character")},
            )
    return label


LABEL_PATTERN = "^[^\\u0000-\\u001f\\u007f-\\u009f\\u061c\\u200e\\u200f\\u202a-\\u202e\\u2066-\\u2069]*$"
"""what `_plain_label` lets through, as the OpenAPI document says it (its clients generate and check against it)"""
PlainText = Annotated[str, AfterValidator(_plain_label), PydanticField(json_schema_extra={"pattern": LABEL_PATTERN})]
Label = PlainText | None
"""a short text shown on the pages and in the command line's tables (a run's name, a proposer, a model)"""


class RunBase(SQLModel):
    name: str | None = Field(default=None, max_length=200, description="a label for people")
    proposer: str | None = Field(default=None, max_length=200, description="e.g. llm, search, replay, human")
    model: str | None = Field(default=None, max_length=200, description="the language model, if any")
    backend: Backend | None = Field(default=None, sa_type=Text)
    notes: str | None = Field(default=None, sa_type=Text)


MAX_STORED_JSON_DEPTH = 32
MAX_STORED_JSON_BYTES = 256 << 10


def _storable(value: dict[str, Any] | None) -> dict[str, Any] | None:
    """JSON kept and served back (a run's config and meta): flat and small enough to serve to every reader."""
    if value is None:
        return None
    depth = _depth(value)
    if depth > MAX_STORED_JSON_DEPTH:
        raise ValueError(f"nested {depth} levels deep, over the limit of {MAX_STORED_JSON_DEPTH}: send flatter JSON")
    size = len(json.dumps(value, default=str))
    if size > MAX_STORED_JSON_BYTES:
        raise ValueError(f"{size} bytes as JSON, over the limit of {MAX_STORED_JSON_BYTES}: keep less here")
    return value


def _depth(node: Any, level: int = 1) -> int:
    if level > MAX_STORED_JSON_DEPTH:  # deep enough to refuse: stop before the recursion runs away
        return level
    children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
    return max((_depth(child, level + 1) for child in children if isinstance(child, (dict, list))), default=level)


StoredJson = Annotated[dict[str, Any], AfterValidator(_storable)]


MAX_NOTES_CHARS = 64 << 10
"""The longest notes a run takes: every GET /v1/runs serves them back."""
Notes = Annotated[str | None, PydanticField(max_length=MAX_NOTES_CHARS, description="free text for people")]


class RunCreate(RunBase):
    model_config = ConfigDict(extra="forbid")  # type: ignore[assignment]

    name: Label = Field(default=None, max_length=200, description="a label for people")
    proposer: Label = Field(default=None, max_length=200, description="e.g. llm, search, replay, human")
    model: Label = Field(default=None, max_length=200, description="the language model, if any")
    notes: Notes = None
    problem: str = Field(min_length=1, description="problem name, see GET /v1/problems")
    config: StoredJson = Field(default_factory=dict, description="the run's settings, kept as given")


class RunUpdate(SQLModel):
    model_config = ConfigDict(extra="forbid")  # type: ignore[assignment]

    status: RunStatus | None = None
    notes: Notes = None
    meta: StoredJson | None = Field(default=None, description="merged into the run's meta (keys replaced)")


RUN_VERSION = "the kernelloop version of the service that created the run (None: a run older than schema v7)"
RUN_COMMIT = (
    "the git commit of the service's checkout when it created the run, `+dirty` with uncommitted changes (None: "
    "an installed package, or a run older than schema v7)"
)


class RunPublic(RunBase):
    id: int
    problem: str
    status: RunStatus
    config: dict[str, Any] = PydanticField(
        description="the run's settings as its client gave them (the agent's: search budget, seed, time budget, ...)"
    )
    meta: dict[str, Any]
    version: str | None = PydanticField(None, description=RUN_VERSION)
    source_commit: str | None = PydanticField(None, description=RUN_COMMIT)
    created_at: datetime
    updated_at: datetime | None
    finished_at: datetime | None
    mode: Mode = PydanticField(
        "infer",
        description="the mode its jobs judged in, as its config says (`kernelloop agent run --mode`); infer where the "
        "config names none",
    )
    attempts: int = 0
    best_attempt_id: int | None = Field(
        default=None,
        description="the run's best correct attempt: the first, in the order they were made, that no later one "
        "cleared (tools.speedup_estimate.best_in_order)",
    )
    best_speedup: float | None = None
    best_speedup_low: float | None = None
    best_speedup_high: float | None = None


# ---------------------------------------------------------------------------------------- attempts

ATTEMPT_CORRECT = (
    "True: the latest counted run_tests passed on every correctness shape of the problem (on the "
    "attempt's backend) with the default number of seeds; False: a run_tests failed; None: neither yet "
    "(a test narrowed by options.shapes or options.seeds never sets it)"
)
ATTEMPT_SPEEDUP = (
    "the median of the geometric-mean speedups of the attempt's counted measurements (passed benchmarks that timed "
    "every benchmark shape of the problem on a host not overloaded; every re-timing is a measurement of its own, "
    "none replaces another), between speedup_low and speedup_high (tools.speedup_estimate); None without one"
)
ATTEMPT_SPEEDUP_LOW = (
    "the low end of the speedup's interval: a kernel ranks above another only when its low end is above the other's "
    "high end"
)
ATTEMPT_SPEEDUP_HIGH = "the high end of the speedup's interval"
ATTEMPT_MEASUREMENTS = "the measurements the speedup counts (GET /v1/attempts/{id}/measurements lists every one)"
STEP = (
    "the agent's step: its proposal number within the run, from 1 (the progress lines and the table of "
    "`kernelloop agent run`); an attempt's step is the step that first proposed its code (a later step that "
    "re-times it adds a measurement with its own step)"
)


class AttemptBase(SQLModel):
    run_id: int | None = Field(default=None, foreign_key="runs.id", index=True)
    parent_id: int | None = Field(default=None, foreign_key="attempts.id", description="the attempt this one revises")
    step: int | None = Field(default=None, description=STEP)
    backend: Backend = Field(sa_type=Text)
    mode: Mode = Field(
        default="infer",
        sa_type=Text,
        description="what its verdicts judged: infer (the forward alone) or train (forward and backward, every "
        "gradient checked; its speedup is forward+backward's); the options.mode it was submitted with",
    )
    proposer: str = Field(default="api", max_length=200, description="who proposed it: llm:MODEL, search, human, api")
    rationale: str | None = Field(default=None, sa_type=Text, description="why it was proposed")


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
    speedup_low: float | None = Field(None, description=ATTEMPT_SPEEDUP_LOW)
    speedup_high: float | None = Field(None, description=ATTEMPT_SPEEDUP_HIGH)
    measurements: int = Field(0, description=ATTEMPT_MEASUREMENTS)
    device: str | None
    created_at: datetime
    updated_at: datetime | None


class EvaluationBase(SQLModel):
    kind: Phase = Field(sa_type=Text)
    status: Status = Field(sa_type=Text, index=True)
    message: str = Field(default="", sa_type=Text)
    backend: Backend = Field(sa_type=Text)
    mode: Mode = Field(default="infer", sa_type=Text, description="infer: the forward alone; train: with the backward")
    device: str = ""
    isolation: str | None = None
    toolchain: dict[str, Any] = Field(default_factory=dict, sa_type=JSON)
    build_seconds: float | None = None
    wall_seconds: float | None = Field(default=None, description="the sandboxed worker's wall time")
    speedup: float | None = Field(default=None, description="benchmark: geometric-mean speedup over eager PyTorch")
    created_at: datetime = Field(default_factory=utcnow, description="when the job was queued")
    started_at: datetime | None = None
    finished_at: datetime | None = None


class EvaluationPublic(EvaluationBase):
    id: int
    attempt_id: int
    job_id: int | None
    result: PhaseResultAny
    coverage: Coverage | None = PydanticField(None, description="test, benchmark: how much of the problem it covered")
    log: str


class ShapeMeasurement(BaseModel):
    """One benchmark shape of a measurement: the candidate's and the reference's timings (median, spread, n)."""

    shape: str
    speedup: float | None = PydanticField(description="reference median / candidate median")
    candidate: Timing | None
    reference: Timing | None
    host_slowdown: float | None = PydanticField(
        description="the host's load while the judge timed this shape's reference (CPU; 1.0 idle): ShapeBenchmark's"
    )


class MeasurementBase(SQLModel):
    step: int | None = Field(
        default=None,
        description=f"the step whose job took it ({STEP}); None: a rerun or a duel's, or a call outside a run",
    )
    measured_at: datetime = Field(description="when the benchmark finished")
    host: str = Field(default="", description="the machine of the service that ran the job (its executor's host)")
    backend: Backend = Field(sa_type=Text)
    device: str = ""
    host_slowdown: float | None = Field(
        default=None, description="the largest of the shapes' host_slowdown: the host's load (CPU; 1.0 idle)"
    )
    host_too_loaded: bool = Field(
        default=False, description="timed on an overloaded host (BenchmarkResult.host_too_loaded): kept, never ranked"
    )
    counted: bool = Field(description="the attempt's speedup counts it (see not_counted)")
    not_counted: str = Field(default="", description="why it is not counted: the host's load, or a narrowed benchmark")
    speedup: float = Field(description="this benchmark's geometric-mean speedup")
    low: float = Field(description="this benchmark's own interval, from its shapes' spread (tools.speedup_estimate)")
    high: float
    deviation: float | None = Field(
        default=None,
        description="how far it lies from the counted measurements before it, in units of their spread (log scale, "
        "tools.speedup_estimate.deviation): 0 agrees, +-2 is far; None when it was the first",
    )
    torch: str | None = Field(default=None, description="torch's version the job built against")
    toolchain: dict[str, Any] = Field(default_factory=dict, sa_type=JSON, description="the build's toolchain")


class MeasurementPublic(MeasurementBase):
    """One benchmark of an attempt, as it was taken: appended, never replaced (GET /v1/attempts/{id}/measurements)."""

    id: int
    attempt_id: int
    evaluation_id: int
    job_id: int | None
    shapes: list[ShapeMeasurement]


class AttemptDetail(AttemptSummary):
    code: str
    evaluations: list[EvaluationPublic]
    jobs: list[int] = PydanticField(description="ids of the jobs that evaluated it")


class AttemptDiff(BaseModel):
    from_attempt: int
    to_attempt: int
    identical: bool
    diff: str = PydanticField(description="unified diff of the two sources")


class PageRequest(BaseModel):
    """Which page of a list (GET /v1/runs and `kernelloop history runs` alike)."""

    model_config = ConfigDict(extra="forbid")

    limit: int = PydanticField(50, ge=1, le=500)
    offset: int = PydanticField(0, ge=0, le=MAX_ID)


class AttemptFilter(BaseModel):
    """Which attempts to list, in what order, and which page."""

    model_config = ConfigDict(extra="forbid")

    problem: str | None = PydanticField(None, max_length=200)
    run_id: int | None = PydanticField(None, ge=1, le=MAX_ID)
    status: AttemptStatus | None = None
    backend: Backend | None = None
    mode: Mode | None = PydanticField(None, description="infer or train: only attempts judged in that mode")
    proposer: str | None = PydanticField(None, max_length=200)
    correct: bool | None = PydanticField(None, description="true: passed run_tests; false: failed it")
    min_speedup: float | None = PydanticField(
        None, ge=0, allow_inf_nan=False, description="only attempts at least this fast"
    )
    sort: Literal["created", "speedup", "step", "id"] = "created"
    order: Literal["asc", "desc"] = "desc"
    limit: int = PydanticField(50, ge=1, le=500)
    offset: int = PydanticField(0, ge=0, le=MAX_ID)


LEADERBOARD_MODE = "infer (default): forward speedups; train: forward+backward speedups (never ranked together)"


class LeaderboardEntry(BaseModel):
    rank: int
    problem: str
    attempt_id: int
    run_id: int | None
    backend: Backend
    mode: Mode = PydanticField(description="infer: the forward's speedup; train: forward+backward's")
    device: str | None
    speedup: float = PydanticField(description=ATTEMPT_SPEEDUP)
    speedup_low: float | None = PydanticField(None, description=ATTEMPT_SPEEDUP_LOW)
    speedup_high: float | None = PydanticField(None, description=ATTEMPT_SPEEDUP_HIGH)
    measurements: int = PydanticField(0, description=ATTEMPT_MEASUREMENTS)
    proposer: str
    created_at: datetime


T = TypeVar("T")


class Page(BaseModel, Generic[T]):
    items: list[T]
    total: int
    limit: int
    offset: int


# ------------------------------------------------------------------------------------------ suites

FAST_P_THRESHOLDS = (0.0, 1.0, 1.5, 2.0)
"""KernelBench's fast_p: the share of a level's problems whose solution is correct and faster than p x the reference"""
MAX_SUITE_ENTRIES = 1000


class SuiteEntryCreate(BaseModel):
    """One problem of a suite and its solution, if there is one (a problem without one counts as not solved)."""

    model_config = ConfigDict(extra="forbid")

    problem: str = PydanticField(min_length=1, max_length=200, description="a problem name (GET /v1/problems)")
    level: str = PydanticField(
        "all", min_length=1, max_length=64, description="the set it is reported under, e.g. KernelBench's level1"
    )
    solution: str | None = PydanticField(
        None, max_length=1000, description="where the solution came from (its file name), for people"
    )
    code: str | None = PydanticField(
        None, description="the solution's Python source defining ModelNew; none: counts as unsolved"
    )


class SuiteCreate(BaseModel):
    """Body of POST /v1/suites: solutions evaluated against their problems, scored as KernelBench scores them."""

    model_config = ConfigDict(extra="forbid")

    name: Label = PydanticField(None, max_length=200, description="a label for people")
    backend: Backend | None = PydanticField(None, description="default: cuda when the service has a GPU, else cpu")
    options: EvalOptions | None = PydanticField(
        None, description="as for /v1/evaluate; options.policy picks the verdict policy (kernelbench, strict, tf32)"
    )
    entries: list[SuiteEntryCreate] = PydanticField(min_length=1, max_length=MAX_SUITE_ENTRIES)

    @field_validator("entries")
    @classmethod
    def _one_entry_per_problem(cls, entries: list[SuiteEntryCreate]) -> list[SuiteEntryCreate]:
        return _one_entry_per_problem(entries)


class SuiteEntriesAdd(BaseModel):
    """Body of POST /v1/suites/{id}/entries: more problems for a suite (a suite run in pieces), judged on the
    suite's backend; its entries so far are kept."""

    model_config = ConfigDict(extra="forbid")

    options: EvalOptions | None = PydanticField(None, description="as for POST /v1/suites (give the same again)")
    entries: list[SuiteEntryCreate] = PydanticField(min_length=1, max_length=MAX_SUITE_ENTRIES)

    @field_validator("entries")
    @classmethod
    def _one_entry_per_problem(cls, entries: list[SuiteEntryCreate]) -> list[SuiteEntryCreate]:
        return _one_entry_per_problem(entries)


def _one_entry_per_problem(entries: list[SuiteEntryCreate]) -> list[SuiteEntryCreate]:
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        if entry.problem in seen:
            raise ValueError(f"entries[{i}]: problem {entry.problem!r} appears twice; give each problem once")
        seen.add(entry.problem)
    return entries


class SuiteEntryPublic(BaseModel):
    problem: str
    level: str
    solution: str | None
    attempt_id: int | None = PydanticField(description="the attempt recorded for the solution (GET /v1/attempts/ID)")
    job_id: int | None
    status: str = PydanticField(
        description="no_solution, refused (the message says why), pending, or the attempt's status "
        "(passed, compile_error, wrong_result, ...)"
    )
    correct: bool = PydanticField(description="the solution passed run_tests on every correctness shape")
    speedup: float | None = PydanticField(description="geometric-mean speedup over the reference, when benchmarked")
    message: str = ""
    seconds: dict[str, float] = PydanticField(
        default_factory=dict,
        description="where the solution's time went: `KIND` (compile, test, benchmark) on its lane, `KIND.queued` "
        "before it, `KIND.STEP` for each step the phase reports (worker_start, runner_start, load, ...)",
    )


class SuiteLevel(BaseModel):
    """KernelBench's metrics over one level's problems."""

    level: str
    problems: int
    with_solution: int
    evaluated: int = PydanticField(description="solutions whose evaluation has ended")
    correct: int
    suspicious: int = PydanticField(
        0,
        description="of the correct ones, those whose benchmark was suspicious (faster than the memory floor, "
        "timed outputs wrong, or the timing envelope disagreed; the entry's message says which): no speedup to "
        "trust, so fast_p leaves them out",
    )
    correctness_rate: float = PydanticField(description="correct / problems")
    fast_p: dict[str, float] = PydanticField(
        description="for each p in 0, 1, 1.5, 2: the share of problems correct with a speedup above p, the "
        "suspicious ones left out"
    )


class SuitePublic(BaseModel):
    id: int
    name: str | None
    backend: Backend
    policy: str | None = PydanticField(description="the policy asked for; none: each problem's own")
    status: Literal["running", "finished"]
    created_at: datetime
    levels: list[SuiteLevel] = PydanticField(description="one per level, then `all` across them when there are several")
    entries: list[SuiteEntryPublic]


# -------------------------------------------------------------------------------------------- jobs


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


class StepProgress(BaseModel):
    """Where a running job is: its current step, for how long, and what its worker last said."""

    step: Phase
    elapsed_s: float = PydanticField(description="seconds since the step started on its lane")
    message: str = PydanticField(description="the worker's last report, e.g. 'checking shape small, seed 7'")


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
    cancel_requested_at: datetime | None = PydanticField(
        None, description="when a client asked to cancel it: from then on no step of it starts, even after a restart"
    )
    reused_attempt: bool = PydanticField(False, description="the same code was already an attempt in this run")
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    results: list[PhaseResultAny] = PydanticField(description="one verdict per step that ran, in order")
    coverage: list[Coverage] = PydanticField(
        [], description="for each test and benchmark step that ran: how much of the problem it covered"
    )
    correct: bool | None = PydanticField(
        None,
        description="what the job counts for the attempt: True from a passed "
        "full-coverage test, False from a failed test, else None",
    )
    speedup: float | None = PydanticField(
        None, description="the geometric-mean speedup of a passed full-coverage benchmark in this job, else None"
    )
    attempt_speedup: SpeedupEstimate | None = PydanticField(
        None, description="the attempt's speedup now, over all its counted measurements (AttemptSummary.speedup)"
    )
    run_step: int | None = PydanticField(None, description=f"the run's step that asked for this job: {STEP}")
    current: StepProgress | None = PydanticField(None, description="while the job runs: its step's progress")
    links: JobLinks


class RerunAnswer(BaseModel):
    """What `POST /v1/attempts/{id}/rerun` answers: the job that re-measures the attempt under its recorded
    settings, and once it finished the measurement it appended and the attempt's speedup before and after."""

    job: JobPublic
    measurement: MeasurementPublic | None = PydanticField(
        None, description="the new measurement, once the job finished with one (its `deviation` says how far it lies)"
    )
    before: SpeedupEstimate | None = PydanticField(None, description="the attempt's speedup before the rerun")
    after: SpeedupEstimate | None = PydanticField(None, description="the attempt's speedup with the new measurement")

    @classmethod
    def of(cls, job: JobPublic, measurements: list[MeasurementPublic], before: SpeedupEstimate | None) -> "RerunAnswer":
        """The answer for the job as it is, from the attempt's measurements (the one the job appended, if any)."""
        added = [m for m in measurements if m.job_id == job.id]
        return cls(job=job, measurement=added[-1] if added else None, before=before, after=job.attempt_speedup)


class DuelRequest(BaseModel):
    """What `POST /v1/attempts/{challenger_id}/duel` takes: the incumbent to re-time the challenger against."""

    model_config = ConfigDict(extra="forbid")

    incumbent_attempt_id: int = PydanticField(
        ge=1,
        le=MAX_ID,
        description="the attempt the challenger (the path's attempt) is timed against: of the same problem, mode and "
        "backend, measured before (a run's best: GET /v1/runs/{id} names it)",
    )


DuelStatus = Literal["running", "finished", "interrupted"]


class DuelBase(SQLModel):
    status: DuelStatus = Field(
        default="running",
        sa_type=Text,
        description="running; finished (with a verdict); interrupted (the service stopped during it: ask again)",
    )
    verdict: Verdict | None = Field(
        default=None,
        sa_type=Text,
        description="confirmed: the challenger faster in every counted round; refuted: the incumbent in every one; "
        "inconclusive: neither (the incumbent stays). tools.duel states the rule",
    )
    reason: str = Field(default="", sa_type=Text, description="why the verdict, with the rounds each side won")
    rounds_needed: int = Field(default=DUEL_ROUNDS, description="the counted rounds the verdict needs")
    created_at: datetime = Field(default_factory=utcnow)
    finished_at: datetime | None = None


class DuelPublic(DuelBase):
    """A duel: the challenger and the incumbent re-timed back to back, the order alternating each round; every
    benchmark is also appended to its attempt as a measurement (its job id is the round's)."""

    id: int
    problem: str
    mode: Mode
    backend: Backend
    challenger_attempt_id: int
    incumbent_attempt_id: int
    rounds: list[DuelRound] = PydanticField(description="every round tried, the ones left out (not counted) too")


# ---------------------------------------------------------------------------------- tool requests


class KernelSubmission(BaseModel):
    """What a tool call carries: the kernel and what to check it against. GET /v1/tools is made from this."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid")  # a misspelt field is refused, not ignored

    problem: str = PydanticField(
        min_length=1, max_length=200, description="problem name, e.g. causal_conv1d (GET /v1/problems lists them)"
    )
    code: str = PydanticField(
        min_length=1,
        validation_alias=AliasChoices("code", "kernel_code"),
        description="Python source defining `class ModelNew(nn.Module)` with the reference Model's constructor "
        "signature; kernels usually come from torch.utils.cpp_extension.load_inline",
    )
    backend: Backend | None = PydanticField(
        None,
        description="cuda (tensors on the GPU) or cpu (C++ via load_inline(cpp_sources=...)); "
        "default: cuda when the service has a GPU, else cpu",
    )
    options: EvalOptions | None = PydanticField(
        None,
        description="shapes, seeds, timing budget; the defaults are strict. A test narrowed to fewer shapes or "
        "seeds than the defaults, or a benchmark narrowed to fewer shapes, is recorded but never "
        "counts: it neither marks the attempt correct nor sets its speedup",
    )
    rationale: str | None = PydanticField(None, max_length=20000, description="why this kernel: kept in the history")

    @field_validator("code")
    @classmethod
    def _code_not_blank(cls, code: str) -> str:
        if not code.strip():
            raise ValueError("code is only whitespace: send the Python source that defines ModelNew")
        return code


class SubmissionRequest(KernelSubmission):
    """Body of POST /v1/compile, /v1/test, /v1/benchmark and /v1/evaluate."""

    run_id: int | None = PydanticField(
        None, ge=1, le=MAX_ID, strict=True, description="the run (agent session) this attempt belongs to"
    )
    parent_attempt_id: int | None = PydanticField(
        None, ge=1, le=MAX_ID, strict=True, description="the attempt this code revises"
    )
    step: int | None = PydanticField(None, ge=0, le=MAX_ID, strict=True, description="the agent's step number")
    proposer: PlainText = PydanticField(
        "api", min_length=1, max_length=200, description="who proposed it, e.g. llm:gpt-5, search, human"
    )


# ----------------------------------------------------------------------- the service's own answers


class GpuInfo(BaseModel):
    index: int
    uuid: str
    name: str
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    utilization_percent: int | None = None


class FieldError(BaseModel):
    field: str = Field(description="where: body.code, query.limit, path.attempt_id, ...")
    message: str
    type: str = ""


class ErrorBody(BaseModel):
    """Every 4xx and 5xx answer has this body."""

    error: str = Field(description="a stable code: invalid_request, malformed_json, unknown_problem, ...")
    message: str
    field: str | None = Field(None, description="the field at fault, when one is")
    fix: str = Field("", description="what to change to make the call succeed")
    errors: list[FieldError] = []


class LaneState(BaseModel):
    name: str
    kind: Literal["cpu", "gpu"]
    gpu: str | None = Field(None, description="the GPU this lane's workers see (CUDA_VISIBLE_DEVICES)")
    job_id: int | None = Field(None, description="the job it is running now")


class QueueDepth(BaseModel):
    cpu: int = Field(description="jobs waiting for a CPU lane")
    gpu: int = Field(description="jobs waiting for a GPU lane")
    running: int
    problem_checks: int = Field(0, description="registrations waiting for a CPU lane to check their problem file")


class NodeInfo(BaseModel):
    """A host that runs steps: this one under the local executor, each node of the cluster under Ray."""

    id: str = Field(description="the host's name, or the Ray node's id")
    address: str
    alive: bool
    cpus: float = Field(description="CPUs it offers to builds and CPU steps")
    gpus: float = Field(description="GPUs it offers to tests and benchmarks")
    gpu_type: str | None = Field(None, description="what Ray reports as the node's accelerator type, e.g. H200")


class DevicesReport(BaseModel):
    gpus: list[GpuInfo] = Field(description="this host's GPUs, as nvidia-smi reports them")
    lanes: list[LaneState]
    queue: QueueDepth
    executor: Literal["local", "ray"] = "local"
    nodes: list[NodeInfo] = Field([], description="the hosts that run steps")


class Health(BaseModel):
    status: Literal["ok"]
    version: str
    schema_version: int
    database: str = Field(
        description="the database URL, password hidden, to a caller with the token; its kind (sqlite) to others"
    )
    isolation: str = Field(description="the sandbox in force for submitted code")
    auth: Literal["token", "none"] = Field(description="none: state-changing calls are open, loopback clients only")
    default_backend: Literal["cuda", "cpu"]
    lanes: dict[str, int]
    queue: QueueDepth
    problems: list[str]
    uptime_s: float
    executor: Literal["local", "ray"] = Field("local", description="where steps run: this host, or a Ray cluster")
    nodes: list[NodeInfo] = Field([], description="the hosts that run steps, with their CPUs and GPUs")


class ToolsCatalog(BaseModel):
    """The tools in OpenAI's function-calling shape, and where each is served."""

    tools: list[dict[str, Any]] = Field(description="pass as `tools` to a chat-completions request")
    endpoints: dict[str, str] = Field(description="tool name -> the POST endpoint that runs it")
    format: Literal["openai", "anthropic"]
