"""The phases, each defined once: compile, test, benchmark and profile, and the `evaluate` job that chains the
first three (a profile is advice for deciding what to change, never a step of a verdict).

Everything else that names a phase (the worker's dispatch, the tool functions, the service's routes and
queue, the tool schemas an agent reads, the command line) is derived from `PHASES` and `TOOLS`, so adding
a phase means a row here and its runner in the judge's `PHASE_RUNNERS` (`kernelloop.tools.judge.phases`, which
imports torch: this module, imported by the service, does not).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from kernelloop.tools.results import Backend, BenchmarkResult, CompileResult, PhaseResult, ProfileResult, TestResult

Phase = Literal["compile", "test", "benchmark", "profile"]
"""One step a sandboxed worker runs and answers with one result."""
JobPhase = Literal["compile", "test", "benchmark", "profile", "evaluate"]
"""What a tool call asks for: one phase, or `evaluate`, the verdict's phases in order until one does not pass."""
ToolName = Literal["compile_kernel", "run_tests", "benchmark", "profile_kernel", "evaluate"]
ShapeKind = Literal["correctness", "benchmark"]


@dataclass(frozen=True)
class PhaseSpec:
    name: Phase
    tool: ToolName
    """the tool's name for agents and in GET /v1/tools"""
    command: str
    """the `kernelloop` subcommand that runs it on a file"""
    result_type: type[PhaseResult]
    timeout_setting: str
    """the SandboxSettings field holding its worker's wall-clock limit"""
    shape_kinds: tuple[ShapeKind, ...]
    """the kinds of shape it needs at least one of, each"""
    needs_gpu: bool
    """on the cuda backend it runs on a GPU lane (a compile never does: builds never hold a GPU)"""
    backends: tuple[Backend, ...]
    """the backends it runs on (a profile: cuda only; the service refuses it on another, agents are not offered it)"""
    summary: str
    """one line for people: the route's docstring and the command's help"""
    description: str
    """what an agent reads in the tool's schema"""


@dataclass(frozen=True)
class ToolSpec:
    """A tool call of the service: the job phase it queues, and where it is served."""

    name: ToolName
    phase: JobPhase
    endpoint: str
    summary: str
    description: str


PHASES: dict[Phase, PhaseSpec] = {
    spec.name: spec
    for spec in (
        PhaseSpec(
            name="compile",
            tool="compile_kernel",
            command="compile",
            result_type=CompileResult,
            timeout_setting="compile_timeout_s",
            shape_kinds=(),
            needs_gpu=False,
            backends=("cuda", "cpu"),
            summary="Build and import the kernel, and instantiate ModelNew for every shape.",
            description="Build and import a kernel submission and instantiate ModelNew for every shape of the "
            "problem. Returns a status (passed, compile_error, missing_model_new, signature_error, runtime_error, "
            "timeout), diagnostics pointing at lines of the submitted source, the build log and the build time.",
        ),
        PhaseSpec(
            name="test",
            tool="run_tests",
            command="test",
            result_type=TestResult,
            timeout_setting="test_timeout_s",
            shape_kinds=("correctness",),
            needs_gpu=True,
            backends=("cuda", "cpu"),
            summary="Compile, then check ModelNew against the float64 truth on every correctness shape.",
            description="Compile, then compare ModelNew against a float64 ground truth on every correctness shape "
            "with fresh random seeds. Returns pass/fail per shape and seed with max abs/rel error, mismatch count "
            "and the first mismatching element; also catches NaN/Inf, mutated inputs, races and use of the "
            "reference's own operator.",
        ),
        PhaseSpec(
            name="benchmark",
            tool="benchmark",
            command="bench",
            result_type=BenchmarkResult,
            timeout_setting="benchmark_timeout_s",
            shape_kinds=("benchmark",),
            needs_gpu=True,
            backends=("cuda", "cpu"),
            summary="Compile, then time ModelNew against the reference on every benchmark shape.",
            description="Compile, then time ModelNew against the eager PyTorch reference on every benchmark shape "
            "(interleaved, L2 flushed, median). Returns per-shape times, speedup, TFLOP/s, GB/s and the fraction "
            "of the roofline floor; a time under the physical floor is reported as suspicious, never as a speedup.",
        ),
        PhaseSpec(
            name="profile",
            tool="profile_kernel",
            command="profile",
            result_type=ProfileResult,
            timeout_setting="profile_timeout_s",
            shape_kinds=("benchmark",),
            needs_gpu=True,
            backends=("cuda",),
            summary="Compile, then profile one forward of ModelNew under Nsight Compute on one benchmark shape.",
            description="Compile, then run one forward of ModelNew under NVIDIA Nsight Compute on one benchmark shape "
            "(options.shapes: [name]; default the first) and report what the hardware saw, per kernel: duration, "
            "grid and block, registers, shared memory, achieved and theoretical occupancy, DRAM and SM throughput, "
            "L1/L2 hit rates, the top warp stall reasons, DRAM bytes, FLOPs and its place on the roofline "
            "(memory- or compute-bound, % of that peak), with a short summary. Advice, not a verdict: it checks no "
            "output. Call it after run_tests passed and benchmark shows the kernel well short of the roofline "
            "floor, to decide what to fix. Needs the cuda backend.",
        ),
    )
}

EVALUATE_STEPS: tuple[Phase, ...] = ("compile", "test", "benchmark")
"""`evaluate` runs these phases in this order and stops at the first that does not pass (the profile is not one of
them: it is advice, asked for on its own)."""

TOOLS: dict[ToolName, ToolSpec] = {
    **{
        spec.tool: ToolSpec(spec.tool, spec.name, f"/v1/{spec.name}", spec.summary, spec.description)
        for spec in PHASES.values()
    },
    "evaluate": ToolSpec(
        "evaluate",
        "evaluate",
        "/v1/evaluate",
        "Compile, test and benchmark, stopping at the first step that does not pass.",
        "Compile, test and benchmark in one call, stopping at the first step that does not pass.",
    ),
}

AGENT_TOOLS: tuple[ToolName, ...] = tuple(spec.tool for spec in PHASES.values())
PHASES_BY_TOOL: dict[ToolName, Phase] = {spec.tool: spec.name for spec in PHASES.values()}
"""The tools a language model is offered: one per phase (`evaluate` is for scripts and the search)."""


def tools_for(backend: Backend) -> tuple[ToolName, ...]:
    """The agent tools that run on this backend."""
    return tuple(name for name in AGENT_TOOLS if backend in PHASES[PHASES_BY_TOOL[name]].backends)


def steps_of(phase: JobPhase) -> tuple[Phase, ...]:
    """The phases a job of this kind runs, in order."""
    return EVALUATE_STEPS if phase == "evaluate" else (phase,)


def shape_kinds_of(phase: JobPhase) -> tuple[ShapeKind, ...]:
    """The kinds of shape a job of this kind needs at least one of, each."""
    return tuple(dict.fromkeys(kind for step in steps_of(phase) for kind in PHASES[step].shape_kinds))


assert set(get_args(Phase)) == set(PHASES), "Phase and PHASES must name the same phases"
assert set(get_args(JobPhase)) == {spec.phase for spec in TOOLS.values()}, "every job phase is a tool"
assert set(get_args(ToolName)) == set(TOOLS), "ToolName and TOOLS must name the same tools"
