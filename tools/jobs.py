"""What crosses the boundary between the caller and a sandboxed worker (worker IPC).

The caller writes one `WorkerJob` (a `Step` and how to answer it) as JSON to the worker's stdin; the worker
answers with one `WorkerReply` on a private pipe, tagged with the job's nonce. The candidate's stdout is never
parsed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kernelloop.tools.phase_registry import Phase
from kernelloop.tools.problems import ProblemSpec
from kernelloop.tools.results import Backend, Mode, PhaseResultAny

Precision = Literal["fp32", "fp16", "bf16"]
"""KernelBench's precision option (`kernelloop.tools.problems.PRECISIONS` maps each to its dtype)"""


class EvalOptions(BaseModel):
    """Knobs a caller may turn; the defaults are what an honest verdict needs."""

    model_config = ConfigDict(extra="forbid")

    shapes: list[str] | None = Field(
        None,
        description="names of shapes to use, each one of the phase's own (correctness shapes for a test, benchmark "
        "shapes for a benchmark or a profile, either for evaluate): another name is refused; default: all of them",
    )
    seeds: int = Field(
        3, ge=1, le=20, description="fresh random input sets per correctness shape (the kernelbench policy: 5 at least)"
    )
    policy: Literal["strict", "tf32", "kernelbench"] | None = Field(
        None,
        description="how a test judges: strict (fp32) or tf32 against the float64 truth, or kernelbench "
        "(KernelBench's own check: allclose against the reference, models in training mode); default: the "
        "problem's own (kernelbench for a KernelBench file without our metadata)",
    )
    mode: Mode = Field(
        "infer",
        description="infer: the forward alone; train: forward and backward, the outputs and the gradients of every "
        "input and parameter checked against the reference's, forward+backward timed as one step",
    )
    precision: Precision | None = Field(
        None,
        description="KernelBench's precision option: the inputs and both models cast to it, the tolerance fitted to "
        "it; default: the problem's own dtype, nothing cast",
    )
    seed: int | None = Field(
        None,
        ge=0,
        lt=2**31,
        description="pin the judge's seeds, to rerun a failure: every input set and model is then drawn from this "
        "seed counted up, in order; default: a fresh seed from the operating system for each, which the candidate "
        "never learns",
    )
    timeout_s: float | None = Field(
        None, gt=0, le=3600, description="wall-clock limit of the worker; default per phase"
    )
    memory_check: bool = Field(
        True,
        description="test, cuda backend: once every check has passed, run the candidate's forward again under "
        "compute-sanitizer (memcheck, racecheck where it uses __shared__, initcheck) on the smallest correctness "
        "shape; a finding fails the test as memory_error. false skips it (faster, and blind to reads past the end)",
    )
    compare_torch_compile: bool = Field(False, description="benchmark: also time torch.compile(Model)")
    time_budget_s: float = Field(
        2.0, gt=0, le=60, description="benchmark: seconds of timing per shape, a cap (3 timed calls are always made)"
    )
    min_samples: int = Field(
        25, ge=3, le=1000, description="benchmark: timed calls per shape at least, as far as the time budget allows"
    )
    max_samples: int = Field(500, ge=3, le=100000, description="benchmark: timed calls per shape at most")

    @model_validator(mode="after")
    def _samples_in_order(self) -> EvalOptions:
        if self.min_samples > self.max_samples:
            raise ValueError(
                f"min_samples ({self.min_samples}) is over max_samples ({self.max_samples}): "
                "give min_samples <= max_samples"
            )
        return self


PHASES_OF_OPTION: dict[str, frozenset[Phase]] = {
    "seeds": frozenset({"test"}),
    "mode": frozenset({"test", "benchmark"}),
    "memory_check": frozenset({"test"}),
    "compare_torch_compile": frozenset({"benchmark"}),
    "time_budget_s": frozenset({"benchmark"}),
    "min_samples": frozenset({"benchmark"}),
    "max_samples": frozenset({"benchmark"}),
}
"""The options only some phases read; every other one applies to every phase."""


def inapplicable_options(options: EvalOptions, phases: tuple[Phase, ...]) -> list[str]:
    """The options set away from their defaults that none of `phases` reads: a caller who sets one expects an
    effect it would not have (compare_torch_compile on a compile). A default sent as it is (a client that sends
    every field) asks for nothing and passes."""
    return sorted(
        name
        for name, phases_reading in PHASES_OF_OPTION.items()
        if not phases_reading & {*phases} and getattr(options, name) != EvalOptions.model_fields[name].default
    )


class OptionRefusal(BaseModel):
    """An option a job would not read, in the words the API and the command line both refuse it with."""

    option: str = Field(description="the EvalOptions field, e.g. seeds")
    message: str
    fix: str


def option_refusal(phase: str, options: EvalOptions, phases: tuple[Phase, ...]) -> OptionRefusal | None:
    """The first option set away from its default that no step of a `phase` job (running `phases`) reads, or None:
    `compare_torch_compile` on a compile would do nothing, and a caller who sets it expects an effect."""
    unused = inapplicable_options(options, phases)
    if not unused:
        return None
    readers = " and ".join(sorted(PHASES_OF_OPTION[unused[0]]))
    return OptionRefusal(
        option=unused[0],
        message=f"options.{unused[0]} does nothing in a {phase} job: only a {readers} step reads it"
        + (f" (nor do {', '.join(unused[1:])})" if len(unused) > 1 else ""),
        fix=f"leave it out of a {phase} call, or call a tool that runs a {readers} step (evaluate runs "
        "compile, test and benchmark)",
    )


class Step(BaseModel):
    """One phase of one submission: what a tool call or the service's queue asks for, handed unchanged through
    the scheduler and the executor (a Ray task's argument on a cluster) to the worker that runs it."""

    phase: Phase
    problem: ProblemSpec
    code: str
    backend: Backend
    options: EvalOptions = Field(default_factory=EvalOptions)


class WorkerJob(BaseModel):
    """A step as its worker gets it: the step, and what the caller set up for it (the nonce its replies carry,
    the job folder's paths, the build cache entry)."""

    step: Step
    nonce: str
    result_fd: int
    submission_path: str = Field(description="where the worker writes the submitted code before importing it")
    build_dir: str = Field(description="TORCH_EXTENSIONS_DIR for this source: the build cache entry")
    cache_key: str
    cache_hit: bool
    sent_at: float = Field(description="time.time() when the caller handed the job over: the worker's start-up")
    build_timeout_s: float = Field(
        600.0, gt=0, description="wall-clock limit of the build and import of the submission (settings.build_timeout_s)"
    )
    nice: int = Field(
        0, ge=0, le=19, description="how far the worker lowers its own and its runner's CPU priority first (a build)"
    )
    observer_library: str | None = Field(
        None,
        description="the operator observer's library as the worker sees it (tools/compilation/observer_library.py)",
    )


FREEZER_FDS_VARIABLE = "KERNELLOOP_FREEZER_FDS"
"""the worker's environment variable that names the freezer's descriptors: `procs,freeze,events[,stat]`"""


@dataclass
class FreezerFiles:
    """Descriptors of the candidate's freezer cgroup, opened by the service: `procs` (cgroup.procs, written once by
    the runner to join), `freeze` (cgroup.freeze), `events` (cgroup.events, which says when all have stopped) and
    `stat` (cpu.stat: the CPU time its processes used, which the judge reads around each reference sample; None
    where the cgroup has none). The kernel checks a write to cgroup.procs against who opened it, so the sandboxed
    runner may join it."""

    procs: int
    freeze: int
    events: int
    stat: int | None = None

    @classmethod
    def open(cls, directory: Path) -> FreezerFiles:
        """The files of the cgroup `directory`, opened by the service (which may write them)."""
        try:
            stat: int | None = os.open(directory / "cpu.stat", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            stat = None
        return cls(
            os.open(directory / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC),
            os.open(directory / "cgroup.freeze", os.O_WRONLY | os.O_CLOEXEC),
            os.open(directory / "cgroup.events", os.O_RDONLY | os.O_CLOEXEC),
            stat,
        )

    def as_variable(self) -> str:
        return ",".join(str(fd) for fd in self.fds())

    @classmethod
    def from_variable(cls, value: str | None) -> FreezerFiles | None:
        try:
            fds = [int(fd) for fd in (value or "").split(",")]
        except ValueError:
            return None
        if len(fds) not in (3, 4):
            return None
        return cls(*fds)

    def fds(self) -> list[int]:
        return [self.procs, self.freeze, self.events, *([self.stat] if self.stat is not None else [])]


class WorkerReply(BaseModel):
    model_config = ConfigDict(ser_json_inf_nan="strings")  # a NaN in a check must not void the whole reply

    nonce: str
    final: bool = False
    result: PhaseResultAny


class ProblemCheckJob(BaseModel):
    """A problem file to load and exercise in the sandbox (`python -m kernelloop.tools.judge.problem_worker`)."""

    path: str
    name: str
    nonce: str


class ProblemCheckReply(BaseModel):
    nonce: str
    spec: ProblemSpec | None = None
    error: str | None = None
    too_large: bool = Field(False, description="the error is an allocation that failed: the problem is too large here")
