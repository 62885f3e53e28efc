"""Which verdicts count for an attempt: only a test or benchmark that covered the whole problem.

A passed run_tests marks an attempt correct only when it checked every correctness shape of the problem on the
attempt's backend with at least the default number of seeds (tools.jobs.EvalOptions().seeds); a passed benchmark
counts for the attempt's speedup only when it timed every benchmark shape, on a host not overloaded
(`host_too_loaded`). A narrower run (options.shapes, fewer seeds) is kept with its evaluation but counts for
nothing, and its `Coverage.note` says so. A failed test counts
whatever it covered: one wrong shape is enough; a test the harness could not carry out (`sandbox_error`: the
reference or its float64 truth failed) counts for nothing. The history (attempt summaries, runs' best, the leaderboard)
and the jobs the API answers with both read this rule, so the agent reads the service's judgement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field

from kernelloop.tools.jobs import EvalOptions
from kernelloop.tools.problems import ProblemSpec
from kernelloop.tools.results import BenchmarkResult, PhaseResult, Status, TestResult

DEFAULT_SEEDS = EvalOptions().seeds
NOT_COUNTED = {
    "test": "a narrowed test does not mark the attempt correct",
    "benchmark": "a narrowed benchmark does not set the attempt's speedup",
}
"""what a passed test or benchmark that did not cover the whole problem does not count for"""


class Coverage(BaseModel):
    """How much of the problem one test or benchmark covered (tools.coverage). Only full coverage counts:
    a passed test marks the attempt correct, a passed benchmark sets its speedup; a narrower one is kept,
    leaves the attempt's summary as it was, and says so in `note`."""

    phase: Literal["test", "benchmark"]
    shapes_checked: int = Field(
        description="test: correctness shapes with a passed check; benchmark: benchmark shapes timed and passed"
    )
    shapes_required: int = Field(description="the problem's shapes of that kind on the attempt's backend")
    seeds_checked: int | None = Field(None, description="test: the fewest passed seeds on a checked shape")
    seeds_required: int | None = Field(None, description="test: the default number of seeds")
    full: bool
    note: str = Field(description="e.g. 'partial coverage: 2 of 6 correctness shapes, 1 of 3 seeds; ...'")


@dataclass(frozen=True)
class Counted:
    """What one result says about its attempt."""

    correct: bool | None = None  # True: a passed full-coverage test; False: a failed test; None: nothing
    speedup: float | None = None  # a passed full-coverage benchmark's geometric-mean speedup
    coverage: Coverage | None = None  # None for a compile


def counted(spec: ProblemSpec, result: PhaseResult) -> Counted:
    """What `result`, a verdict on an attempt at problem `spec`, counts for that attempt."""
    if isinstance(result, TestResult):
        coverage = correctness_coverage(spec, result)
        if result.compile is not None and not result.compile.ok:
            return Counted(coverage=coverage)  # never got to test: says nothing about correctness
        if result.status == Status.sandbox_error:
            return Counted(coverage=coverage)  # the harness failed (the reference, its truth): not the kernel
        if not result.ok:
            return Counted(correct=False, coverage=coverage)
        return Counted(correct=True if coverage.full else None, coverage=coverage)
    if isinstance(result, BenchmarkResult):
        coverage = benchmark_coverage(spec, result)
        # timed on an overloaded host: kept and marked, but its speedup says more about the load than the kernel
        counts = result.ok and coverage.full and bool(result.geomean_speedup) and not result.host_too_loaded
        return Counted(speedup=result.geomean_speedup if counts else None, coverage=coverage)
    return Counted()


def correctness_coverage(spec: ProblemSpec, result: TestResult) -> Coverage:
    required = [s.name for s in spec.correctness_shapes(result.backend)]
    passed = [c for c in result.checks if c.status == Status.passed]
    seeds = {name: {c.seed for c in passed if c.shape == name} for name in required}
    checked = [len(found) for found in seeds.values() if found]
    fewest_seeds = min(checked, default=0)
    full = len(checked) == len(required) and fewest_seeds >= DEFAULT_SEEDS
    extent = f"{len(checked)} of {len(required)} correctness shapes, " + (
        f"{fewest_seeds} seeds each" if full else f"{fewest_seeds} of {DEFAULT_SEEDS} seeds"
    )
    return Coverage(
        phase="test",
        shapes_checked=len(checked),
        shapes_required=len(required),
        seeds_checked=fewest_seeds,
        seeds_required=DEFAULT_SEEDS,
        full=full,
        note=_note("test", full, result.ok, extent),
    )


def benchmark_coverage(spec: ProblemSpec, result: BenchmarkResult) -> Coverage:
    required = {s.name for s in spec.benchmark_shapes(result.backend)}
    timed = {s.shape for s in result.shapes if s.status == Status.passed} & required
    full = timed == required
    return Coverage(
        phase="benchmark",
        shapes_checked=len(timed),
        shapes_required=len(required),
        full=full,
        note=_note("benchmark", full, result.ok, f"{len(timed)} of {len(required)} benchmark shapes"),
    )


def _note(phase: Literal["test", "benchmark"], full: bool, passed: bool, extent: str) -> str:
    """Full or partial coverage of what extent, and for a partial one that passed, what it does not count for."""
    if full:
        return f"full coverage: {extent}"
    return f"partial coverage: {extent}" + (f"; {NOT_COUNTED[phase]}" if passed else "")
