"""The profile phase: one forward of the candidate's under Nsight Compute (ncu), read into what the hardware saw.

The profile is advice, not a verdict: nothing is checked first but that the kernel builds and its forward runs.
The judge builds and loads the submission as every phase does, times one forward itself (CUDA events in the
main runner, ncu nowhere near), then turns to a second runner under ncu (`RunnerLink(wrapper=...)`, started as
the phase begins so that its interpreter and torch boot meanwhile; it touches the GPU only once asked to start),
shares one input set of the shape (drawn as the benchmark draws it), and asks for a warm-up forward and then one
inside the NVTX range ncu's filter selects. ncu's table reaches the judge on a pipe of its own, which the
candidate's output never joins; the judge parses it (`ncu_report`), places each kernel on the datasheet's roofline
and writes the summary (`profile_summary`), and holds the kernels' summed time against its own: a profile that
missed the forward's work (kernels launched outside the range) disagrees with it and carries a warning.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

import torch

from kernelloop.tools.datasheet import datasheet_peaks
from kernelloop.tools.jobs import WorkerJob
from kernelloop.tools.judge import ncu_report, profile_summary, timing
from kernelloop.tools.judge.compiling import load, start
from kernelloop.tools.judge.device_state import set_precision_policy
from kernelloop.tools.judge.gpu_tools import gpu_tool, missing_tool_message
from kernelloop.tools.judge.reference import reference_on, reference_outputs, seeded_reference
from kernelloop.tools.judge.runner_link import RunnerFailed, RunnerLink, ToolRun
from kernelloop.tools.judge.session import (
    CALL_DEADLINE_FACTOR,
    Fail,
    Report,
    Session,
    answered,
    as_failure,
    harness_failure,
    selected,
    stopwatch,
)
from kernelloop.tools.judge.shared_buffers import prepare, share
from kernelloop.tools.problems import ShapeSpec
from kernelloop.tools.results import ProfileResult, Status
from kernelloop.tools.runner.messages import NVTX_RANGE, Call

DISAGREEMENT_FACTOR = 3.0
"""the profiled kernels' summed time and the judge's own time of the forward may differ by this factor before the
profile carries a warning (ncu runs the kernels at base clocks, cold, one at a time; the judge's time includes
the launches between them)"""
JUDGE_TIMED_CALLS = 3
"""timed forwards in the main runner, after a warm-up: the judge's time is their median"""
PROFILED_CALL_S = 300.0
"""the deadline of the forward under ncu, which replays every kernel once per pass of its metrics"""
TOOL_EXIT_S = 120.0
"""how long ncu may take to write its table after the runner ends"""
TOOL_LOG_CHARS = 64 << 10
"""ncu's output kept in the result, its end (the table comes last)"""


def profile_phase(job: WorkerJob, link: RunnerLink, report: Report) -> ProfileResult:
    step = job.step
    result = ProfileResult(status=Status.passed, problem=step.problem.name, backend=step.backend)
    shapes = selected(step.problem.benchmark_shapes(step.backend), step.options.shapes)
    ncu = gpu_tool("ncu")
    unable = _unable(step.backend, shapes, ncu, [s.name for s in step.problem.benchmark_shapes(step.backend)])
    if unable or ncu is None:
        result.status, result.message = Status.sandbox_error, unable
        return result
    # the runner under ncu boots (an interpreter and torch under the tool) while the main runner works
    booted = RunnerLink(
        wrapper=ncu_report.ncu_command(ncu, NVTX_RANGE), forbidden_libraries=step.problem.forbidden_libraries
    )
    try:
        return _profiled(job, link, report, result, shapes[0], booted)
    finally:
        booted.close()


def _profiled(
    job: WorkerJob, link: RunnerLink, report: Report, result: ProfileResult, shape: ShapeSpec, booted: RunnerLink
) -> ProfileResult:
    result.shape = shape.name
    compiled, session = start(job, link, report)
    result.compile, result.device = compiled, compiled.device
    if session is None:
        return _failed(result, compiled.status, compiled.message)
    set_precision_policy(session.policy)
    compiled = result.compile = load(session, compiled)
    result.step_seconds = compiled.step_seconds
    if compiled.status != Status.passed:
        return _failed(result, compiled.status, compiled.message)
    report(result)
    try:
        profiled = _shape_setup(session, shape)
        with stopwatch(result, "judge_timing"):
            result.judge_ms = _judge_time(session, profiled)
    except (Fail, RunnerFailed) as exc:
        before = as_failure(exc, "in a forward before the profiler ran")
        return _failed(result, before.status, before.message)
    except Exception as exc:  # raised in the judge's own process (the candidate runs in the runner's)
        return _failed(result, Status.sandbox_error, harness_failure("the judge failed before profiling", exc))
    link.close()  # the main runner's work is done: the device's memory is the profiled runner's now
    with stopwatch(result, "profile"):
        tool_run, failure = _profiled_forward(job, profiled, booted)
    result.tool_seconds = tool_run.seconds
    if failure is not None and ncu_report.NO_COUNTERS not in tool_run.output:
        result.tool_log = tool_run.output[-TOOL_LOG_CHARS:]
        return _failed(result, failure.status, failure.message)
    return read_profile(result, tool_run)


def _unable(backend: str, shapes: list[ShapeSpec], ncu: str | None, known: list[str]) -> str:
    """Why this job cannot be profiled at all, in words that say what to do; empty when it can."""
    if backend != "cuda":
        return "profile_kernel needs the cuda backend: Nsight Compute profiles GPU kernels; send backend cuda"
    if not shapes:
        return f"no benchmark shape to profile among those asked for: use one of {', '.join(known) or 'none'}"
    if ncu is None:
        return missing_tool_message("ncu")
    return ""


def _failed(result: ProfileResult, status: Status, message: str) -> ProfileResult:
    result.status, result.message = status, message
    return result


@dataclass(frozen=True)
class ProfiledShape:
    """What a profile's forwards run on: one input set of the shape, drawn as the benchmark draws its first, the
    reference's outputs on it (the slots' shapes), and the reference (its parameters go to the candidate) with
    the seed it was built under."""

    shape: ShapeSpec
    inputs: list[Any]
    outputs: list[torch.Tensor]
    model_seed: int
    reference: torch.nn.Module

    def warm_up(self, session: Session, where: str) -> None:
        """Share the input set with a runner, build the candidate there, and call it once, untimed."""
        shared = share(session.device, self.reference, [self.inputs], self.outputs, n_slots=1)
        prepare(session, "candidate", self.shape, self.model_seed, shared)
        answered(session.ask_call(Call(input_set=0, slot=0, timed=False), 1.0), f"the warm-up forward{where}")


def _shape_setup(session: Session, shape: ShapeSpec) -> ProfiledShape:
    """The shape's input set, outputs and reference (`ProfiledShape`)."""
    reference, model_seed, drawn = seeded_reference(session, shape)
    with reference_on(shape):
        inputs = drawn.first_set()
    return ProfiledShape(shape, inputs, reference_outputs(reference, inputs, shape), model_seed, reference)


def _judge_time(session: Session, profiled: ProfiledShape) -> float:
    """The forward's time on this input set in the main runner, by CUDA events, with ncu nowhere near, each
    call after the judge's L2 flush (ncu flushes the caches before each kernel it profiles)."""
    clock = timing.Clock(session.device)
    profiled.warm_up(session, "")
    times = []
    for _ in range(JUDGE_TIMED_CALLS):
        clock.clear()
        called = session.ask_call(Call(input_set=0, slot=0, timed=True), 1.0)
        answered(called, "a timed forward")
        times.append(min(called.elapsed_ms or 0.0, session.link.last_envelope_ms))
    return round(statistics.median(times), 4)


def _profiled_forward(job: WorkerJob, profiled: ProfiledShape, link: RunnerLink) -> tuple[ToolRun, Fail | None]:
    """The second runner, under ncu (`link`): the build loaded again (from the cache), a warm-up forward outside
    the range, one inside it; then ncu's exit and its output, and how the forward failed if it did (ncu's output
    says more: a host that restricts the counters, a tool that could not start the runner)."""
    failure: Fail | None = None
    try:
        again, session = start(job, link, lambda _: None)
        if session is None:
            raise Fail(again.status, f"the runner under ncu did not start: {again.message}")
        again = load(session, again)
        if again.status != Status.passed:
            raise Fail(again.status, f"under ncu, the build did not load again: {again.message}")
        profiled.warm_up(session, " under ncu")
        in_range = Call(input_set=0, slot=0, timed=False, nvtx_range=True)
        answered(session.ask_call(in_range, PROFILED_CALL_S / CALL_DEADLINE_FACTOR), "the forward under ncu")
    except (Fail, RunnerFailed) as exc:
        failure = as_failure(exc, "in the forward under ncu")
    except Exception as exc:  # the judge's own side (sharing the inputs)
        failure = Fail(Status.sandbox_error, harness_failure("the judge failed while profiling", exc))
    return link.finish_tool(TOOL_EXIT_S), failure


def read_profile(result: ProfileResult, tool_run: ToolRun) -> ProfileResult:
    """ncu's table as kernels on the roofline, the summary, and the warnings; ncu's own failures as the status."""
    table = ncu_report.split_output(tool_run.output)
    result.tool_log = tool_run.output[-TOOL_LOG_CHARS:]
    if ncu_report.NO_COUNTERS in tool_run.output:
        return _failed(result, Status.sandbox_error, ncu_report.COUNTERS_REMEDY)
    if tool_run.timed_out or (tool_run.returncode != 0 and not table.rows):
        how = "did not finish in time" if tool_run.timed_out else f"ended with {tool_run.signal or tool_run.returncode}"
        last = " | ".join(line for line in table.log[-3:] if line.strip())
        return _failed(result, Status.sandbox_error, f"ncu {how}" + (f": {last}" if last else ""))
    peaks = datasheet_peaks(result.device)
    kernels = [profile_summary.place_on_roofline(k, peaks) for k in ncu_report.kernel_profiles(table)]
    result.kernels = kernels
    result.profiled_ms = round(sum(k.duration_us or 0.0 for k in kernels) / 1e3, 4)
    result.summary = profile_summary.summarize(kernels, result.shape)
    result.warnings = _warnings(result, peaks is None, tool_run.output_truncated)
    result.message = result.summary.splitlines()[0]
    return result


def _warnings(result: ProfileResult, no_peaks: bool, truncated: bool) -> list[str]:
    warnings = []
    if not result.kernels:
        warnings.append("ncu profiled no kernel in the forward's range: the forward launched none there")
    judge, profiled = result.judge_ms, result.profiled_ms
    if judge and profiled and not 1 / DISAGREEMENT_FACTOR <= profiled / judge <= DISAGREEMENT_FACTOR:
        warnings.append(
            f"the profiled kernels take {profiled:.4f} ms in all, the judge timed the forward at {judge:.4f} ms: "
            f"more than {DISAGREEMENT_FACTOR:g}x apart, so the profile may not show where the forward's time goes "
            "(kernels outside the profiled range, or a forward dominated by launches between short kernels)"
        )
    if no_peaks:
        warnings.append(f"{result.device or 'this device'} is not in the datasheet table: no roofline placement")
    if truncated:
        warnings.append("ncu's output was cut at its cap: kernels past it are missing")
    return warnings
