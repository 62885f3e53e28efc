"""What crosses the agent's internal boundaries: the run's configuration, a proposal, its outcome.

A proposer hands the loop `Proposal`s (or `ProposerDone`); the loop turns each into an attempt through
the service and hands back an `Outcome`. `AgentRunConfig` is stored with the run (POST /v1/runs
`config`), which is what `kernelloop agent resume` reads back.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from kernelloop.agent.templates import Params
from kernelloop.contract import JobPublic, JobStatus
from kernelloop.tools.jobs import EvalOptions, Precision
from kernelloop.tools.phase_registry import TOOLS, ToolName, steps_of
from kernelloop.tools.results import Backend, Mode, PhaseResultAny, Status
from kernelloop.tools.speedup_estimate import SpeedupEstimate

ProposerName = Literal["llm", "search", "replay"]
ApiStyle = Literal["openai", "anthropic"]
StepStatus = Status | Literal["service_error"]
"""What one step came to: the tool's verdict, or `service_error` when the service gave none."""
LineStatus = StepStatus | Literal["pending", "failed", "cancelled"]
"""A row of the run's table: a step's status, or for a row restored on resume its attempt's, which may be pending
(its job still queued or running), failed or cancelled."""


def status_text(status: LineStatus) -> str:
    """The status as a word (an f-string of a Status gives `Status.passed` on Python 3.11)."""
    return status.value if isinstance(status, Status) else status


class LlmConfig(BaseModel):
    """Where the language model is and how to talk to it. The key itself is never stored, only where it comes from."""

    api: ApiStyle = "openai"
    base_url: str
    model: str
    api_key_env: str | None = Field(None, description="environment variable holding the API key")
    max_tokens: int = Field(8192, ge=256)
    temperature: float | None = None
    context_chars: int = Field(
        120_000, ge=8_000, description="conversation size kept before older turns are summarized"
    )
    timeout_s: float = Field(300.0, gt=0, description="one model call")
    max_retries: int = Field(5, ge=0, le=20, description="retries on 429, 5xx and dropped connections")


class AgentRunConfig(BaseModel):
    """One run's settings, kept with the run so that it can be resumed."""

    problem: str
    backend: Backend | None = Field(None, description="None until the runner asks the service for its default")
    proposer: ProposerName
    iterations: int | None = Field(None, ge=1, description="attempts (proposals) in all; None: until max_run_s")
    max_run_s: float | None = Field(None, gt=0, description="the run's wall clock: no new proposal after this many s")
    parallel: int = Field(1, ge=1, le=64, description="trajectories sharing one service")
    seed: int = 0
    llm: LlmConfig | None = None
    transcript: str | None = Field(None, description="replay: the recorded transcript's path")
    search_time_budget_s: float = Field(0.5, gt=0, le=60, description="search: benchmark seconds per shape, first rung")
    memory_check: bool = Field(
        True, description="a test on cuda ends with the forward under compute-sanitizer; false skips it in every job"
    )
    precision: Precision | None = Field(
        None,
        description="KernelBench's precision option for every job: inputs and both models cast to it; None: the "
        "problem's own dtype",
    )
    mode: Mode = Field(
        "infer",
        description="infer: the forward alone; train: every job judges and times forward and backward, and the "
        "search proposes only templates that carry a backward",
    )
    duels: bool = Field(
        True,
        description="a step whose median beats the best's inside the noise asks for a duel (both re-timed back to "
        "back, on the run's time budget); false leaves every duel out, the best then moves on intervals alone",
    )
    max_tool_errors: int = Field(
        3, ge=1, description="llm: replies in a row without a usable tool call before a trajectory ends"
    )
    regression_reset: int = Field(
        3, ge=1, description="llm: regressions in a row before the conversation restarts from the best"
    )
    output: str | None = Field(None, description="where the best kernel is written; default: inside the data folder")

    @model_validator(mode="before")
    @classmethod
    def _older_name(cls, data: Any) -> Any:
        """Runs stored before the rename carry the run's limit as `time_budget_s`: read it as `max_run_s`."""
        if isinstance(data, dict) and "time_budget_s" in data and "max_run_s" not in data:
            data = {("max_run_s" if k == "time_budget_s" else k): v for k, v in data.items()}
        return data

    @property
    def chosen_backend(self) -> Backend:
        """The backend, once the runner has settled it (the service's default where none was asked for)."""
        if self.backend is None:
            raise ValueError("the run's backend is not settled: the runner sets it before any proposer starts")
        return self.backend


def job_options(proposed: EvalOptions | None, config: AgentRunConfig, tool: ToolName) -> EvalOptions | None:
    """A proposal's options as the run sends them: the run's own settings (the memory check, the precision, the
    mode) win over what a proposer (a model) asked, where the tool's steps read them; with none set, the proposal's
    options go out as they came."""
    overrides: dict[str, Any] = {}
    steps = steps_of(TOOLS[tool].phase)
    if not config.memory_check and "test" in steps:
        overrides["memory_check"] = False
    if config.precision is not None:
        overrides["precision"] = config.precision
    if config.mode != "infer" and {"test", "benchmark"} & {*steps}:
        overrides["mode"] = config.mode
    if not overrides:
        return proposed
    return (proposed or EvalOptions()).model_copy(update=overrides)


class Proposal(BaseModel):
    """One kernel to evaluate, and why."""

    code: str
    tool: ToolName = "evaluate"
    rationale: str = ""
    label: str = Field("", description="a few words for the progress line, e.g. 'cpu_blocked OB=8 TB=32'")
    parent_attempt_id: int | None = Field(None, description="None: the loop uses the trajectory's current base")
    options: EvalOptions | None = None
    tool_call_id: str | None = Field(None, description="llm: the model's tool call this answers")
    key: str | None = Field(
        None, description="the proposer's own name for this candidate (search: template and params)"
    )


class ProposerDone(BaseModel):
    """A trajectory has nothing more to propose; `failed` when it ended on an error the user must fix."""

    reason: str
    failed: bool = False


class Outcome(BaseModel):
    """What one proposal came to, as the service measured it."""

    step: int
    trajectory: int
    tool: ToolName
    attempt_id: int | None = None
    parent_attempt_id: int | None = None
    job_id: int | None = None
    status: StepStatus = Field(description="the tool's Status, or service_error")
    message: str = ""
    results: list[PhaseResultAny] = []
    correct: bool | None = Field(
        None, description="run_tests passed on every correctness shape (False: failed; None: not tested or narrowed)"
    )
    speedup: float | None = Field(
        None, description="geometric-mean speedup of a passed benchmark of every benchmark shape in this step"
    )
    attempt_speedup: SpeedupEstimate | None = Field(
        None,
        description="the attempt's speedup over every counted measurement, as the service states it after this step",
    )
    seconds: float = 0.0
    service_error: str | None = None
    regressed: bool = Field(False, description="worse than the best so far: the trajectory returns to the best")
    best_attempt_id: int | None = None
    best_speedup: float | None = None
    adopted: bool = Field(
        False, description="the job the service ran for this kernel while no loop was there to see it, read back"
    )

    @property
    def passed(self) -> bool:
        return self.status == Status.passed


def outcome_fields(job: JobPublic) -> tuple[StepStatus, str, bool | None, float | None]:
    """(status, message, correct, speedup) of a job: its last verdict's, and what the service counted for the
    attempt (a test or benchmark narrowed to fewer shapes or seeds counts for neither: tools.coverage)."""
    if job.status == JobStatus.failed:
        return "service_error", job.note or "the service could not run the job", None, None
    if not job.results:
        if job.status == JobStatus.cancelled:
            return "service_error", job.note or "the job was cancelled before any step gave a verdict", None, None
        return "service_error", "the job returned no verdict", None, None
    last = job.results[-1]
    return last.status, last.message, job.correct, job.speedup


class AttemptLine(BaseModel):
    """One row of the run's table."""

    step: int
    trajectory: int
    attempt_id: int | None
    parent_attempt_id: int | None
    tool: ToolName
    label: str
    status: LineStatus
    correct: bool | None
    speedup: float | None
    seconds: float


class ShapeWinner(BaseModel):
    """The fastest passed candidate on one benchmark shape: which kernel (template and parameters, so it can be
    rebuilt) and its speedup there. Kept in the run's meta, so the winners outlive the run."""

    label: str
    template: str | None = Field(None, description="the template file's stem; None for the baseline example file")
    params: Params | None = None
    attempt_id: int | None = None
    speedup: float


class RunSummary(BaseModel):
    run_id: int
    problem: str
    backend: Backend
    proposer: str
    status: Literal["finished", "interrupted", "failed"]
    reason: str
    steps: int
    attempts: list[AttemptLine]
    first_speedup: float | None = Field(
        None, description="the speedup of the correct, benchmarked attempt of the earliest step"
    )
    best_attempt_id: int | None = None
    best_speedup: float | None = None
    best_path: str | None = None
    best_per_shape: dict[str, ShapeWinner] = Field(
        {}, description="search: per benchmark shape, the fastest candidate and its speedup"
    )
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
