"""The memory check: the test phase's last step on the cuda backend, once every check has passed.

A kernel can read past the end of its input, race on shared memory or read memory nobody wrote, and still pass
every tolerance by luck. So the judge runs the candidate's forward once more, on the smallest correctness shape
(by `check_bytes()`), in a runner of its own started under NVIDIA's compute-sanitizer (`RunnerLink(wrapper=...)`):
`--tool memcheck` (out-of-bounds and misaligned accesses), `--tool racecheck` where the submitted source uses
`__shared__` (shared-memory hazards), and `--tool initcheck` (reads of device memory nothing wrote). Each run draws
a fresh input and judges what the candidate wrote like any check (`kernelloop.tools.judge.expectation`), so what
ran under the tool must be right too, and must call no forbidden operator.

The verdict is the tool's, read by the judge alone: its exit code (`--error-exitcode`) and its own output
(`kernelloop.tools.judge.sanitizer_report`), which goes to a pipe the candidate's runner does not write to. A
reported error fails the test as `memory_error`, naming the tool, the access, the kernel, the thread and the line
of the submitted source (builds carry `-lineinfo`: `kernelloop.tools.compilation.toolchain`). A tool that runs out of
its time is a `timeout`; one that dies of a signal, exits oddly or ends without its summary line is `suspicious`:
nothing the runner says can stand in for the tool's verdict.

What the tools must see, and how they are made to see it:

- The inputs and parameters are staged in host memory and copied by the runner onto its device, into memory of
  its own (`share(..., staged=True)`), rather than opened as CUDA IPC memory the judge wrote. Two reasons. An IPC
  handle opens the whole block of the judge's memory pool it points into, so a read one element past the end of
  an input lands in the judge's next tensor and memcheck, which knows allocations only, sees nothing wrong. And
  initcheck knows nothing of what another process wrote: every read of IPC memory would be reported as a read
  of uninitialized memory (on the H200, a forward on IPC inputs under initcheck did not finish in 4 minutes).
  The runner's copies are host-to-device copies that initcheck sees written. PyTorch's caching allocator is off
  in that runner (`PYTORCH_NO_CUDA_MEMORY_CACHING=1`), so each tensor is an allocation of its exact size: a
  read past its end is a read past an allocation.
- initcheck watches every kernel, not only the candidate's own (no `--kernel-name` filter): a kernel the tool
  does not watch leaves what it writes unknown to the tool, so filtering out PyTorch's kernels would make the
  outputs of the operators a candidate calls (a `torch.empty` filled by `copy_`, an `F.pad`) read as
  uninitialized in the candidate's kernel. What the candidate's forward launches is the candidate's, library
  kernels included. initcheck also checks the copies the runner makes of the outputs (`--check-api-memory-access`
  stays on): an output element the kernel never wrote is reported there.
- memcheck leaves CUDA API errors out (`--report-api-errors no`): PyTorch probes APIs that may fail by design;
  a kernel's bad access is reported as the access itself.

The tools' runners are started as the test begins (`boot_tools`), each an interpreter and torch under its tool,
so they boot on the CPUs while the checks run rather than one after another once they have passed (on the H200's
GPU check the memory check was most of a test's time holding the GPU). Until the check asks one to start, a
booted runner runs only the runner's own code and has not touched the GPU; the test's last step closes those it
did not use.

What it does not catch is said in the README ("What the judge guarantees"): one forward on one small shape sees only
the accesses that run makes, and a submission that recognises the tool can run other code under it (what that
code computes is still checked).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from kernelloop.tools.compilation.diagnostics import excerpt, submitted_line
from kernelloop.tools.jobs import Step, WorkerJob
from kernelloop.tools.judge import sanitizer_report
from kernelloop.tools.judge.compiling import load, start
from kernelloop.tools.judge.device_state import device_of, synchronize
from kernelloop.tools.judge.expectation import expected_for, judged, take_outputs
from kernelloop.tools.judge.gpu_tools import gpu_tool, missing_tool_message
from kernelloop.tools.judge.gradients import judge_gradient_calls
from kernelloop.tools.judge.runner_link import RunnerFailed, RunnerLink, ToolRun
from kernelloop.tools.judge.sanitizer_report import SanitizerReport
from kernelloop.tools.judge.session import (
    CALL_DEADLINE_FACTOR,
    Fail,
    Session,
    as_failure,
    forbidden_message,
    selected,
    stopwatch,
)
from kernelloop.tools.judge.shared_buffers import poison, prepare, share, upload_upstream
from kernelloop.tools.problems import ShapeSpec
from kernelloop.tools.results import (
    MemoryCheck,
    MemoryFinding,
    MemoryTool,
    MemoryToolRun,
    ShapeCheck,
    Status,
    TestResult,
)
from kernelloop.tools.runner.messages import Backward, Call

ERROR_EXIT_CODE = 86
"""the tool's exit code when it found an error (`--error-exitcode`): not one Python or a signal gives"""
PRINT_LIMIT = 20
MAX_CHECKED_BYTES = 2 << 30
"""the most a shape's inputs and outputs may hold for its forward to run under the tools"""
TOOL_LIMIT_S = 240.0
"""one tool's run: a fresh interpreter and torch under the tool, the cached build imported, one forward"""
FINISH_S = 30.0
CALL_UNDER_TOOL_S = 120.0
"""the forward's deadline under a tool (its first launches are instrumented: seconds, not milliseconds)"""
TOOL_OPTIONS: dict[MemoryTool, list[str]] = {
    "memcheck": ["--report-api-errors", "no"],
    "racecheck": [],
    "initcheck": [],
}
_SHARED_MEMORY = re.compile(r"\b__shared__\b")


def tools_for(code: str) -> list[MemoryTool]:
    """memcheck and initcheck always; racecheck only where the source declares shared memory."""
    tools: list[MemoryTool] = ["memcheck"]
    if _SHARED_MEMORY.search(code):
        tools.append("racecheck")
    return [*tools, "initcheck"]


BootedTools = dict[MemoryTool, RunnerLink]
"""runners started under their tools ahead of the check, by tool; the check takes each out as it uses it"""


def boot_tools(job: WorkerJob) -> BootedTools:
    """A runner under each tool the job's memory check will run, started now; none where it will not run. A tool
    that cannot be started here is started again by the check, which then says why it failed."""
    step, sanitizer = job.step, gpu_tool("compute-sanitizer")
    if sanitizer is None or skip_reason(step, device_of(job), sanitizer):
        return {}
    if not selected(step.problem.correctness_shapes(step.backend), step.options.shapes):
        return {}  # the test fails on that before any check
    if too_large(_checked_shape(step)):
        return {}
    booted: BootedTools = {}
    for tool in tools_for(step.code):
        try:
            booted[tool] = _tool_link(step.problem.forbidden_libraries, sanitizer, tool)
        except OSError:
            break
    return booted


def memory_check(session: Session, result: TestResult, booted: BootedTools) -> None:
    """Run the candidate under each tool in turn (in the runner `booted` holds for it, else one started now); the
    first that fails decides the test's status. A check that cannot run here (the cpu backend, no
    compute-sanitizer, turned off) says why and leaves the verdict alone."""
    check = MemoryCheck()
    result.memory_check = check
    sanitizer = gpu_tool("compute-sanitizer")
    check.skipped = skip_reason(session.step, session.device, sanitizer)
    if check.skipped is not None or sanitizer is None:
        return
    session.link.close()  # the checks are done: the main runner's memory is the runner's under the tool now
    step = session.step
    shape = _checked_shape(step)
    check.skipped = too_large(shape)
    if check.skipped is not None:
        return
    check.shape, check.seed = shape.name, session.seeds.draw()
    passed_message = result.message
    for tool in tools_for(step.code):
        result.message = f"memory check: compute-sanitizer {tool} on shape {shape.name}"
        session.report(result)
        with stopwatch(result, f"memory_check.{tool}"):
            link = booted.pop(tool, None)
            status, message = _run_tool(session, link or sanitizer, tool, shape, check)
        if status != Status.passed:
            result.status, result.message = status, message
            return
    tools = ", ".join(run.tool for run in check.tools)
    result.message = f"{passed_message}; no memory errors under compute-sanitizer ({tools}, shape {shape.name})"


def _checked_shape(step: Step) -> ShapeSpec:
    """The smallest correctness shape the job asked for: the one the tools run on."""
    shapes = selected(step.problem.correctness_shapes(step.backend), step.options.shapes)
    return min(shapes, key=lambda s: s.check_bytes() or 0)


def too_large(shape: ShapeSpec) -> str | None:
    """Why the smallest correctness shape is not checked, if it holds more than the tools are given: its inputs are
    staged through host memory, and every access of every kernel is watched (a KernelBench problem's one shape may
    hold gigabytes)."""
    held = (shape.input_bytes or 0) + (shape.output_bytes or 0)
    if held <= MAX_CHECKED_BYTES:
        return None
    return (
        f"the smallest correctness shape, {shape.name}, holds {held / 2**30:.1f} GiB of inputs and outputs, over the "
        f"{MAX_CHECKED_BYTES / 2**30:.0f} GiB the memory check runs on; give the problem a smaller correctness shape "
        "(SHAPES) to have its kernels checked"
    )


def skip_reason(step: Step, device: torch.device, sanitizer: str | None) -> str | None:
    if not step.options.memory_check:
        return "turned off (memory_check: false, --no-memory-check)"
    if step.backend != "cuda":
        return "the cpu backend: compute-sanitizer checks GPU kernels only"
    if device.type != "cuda":
        return "no GPU is visible to the judge"
    if sanitizer is None:
        return missing_tool_message("compute-sanitizer")
    return None


def _run_tool(
    session: Session, runner: RunnerLink | str, tool: MemoryTool, shape: ShapeSpec, check: MemoryCheck
) -> tuple[Status, str]:
    """One tool's run, in its booted `runner` or one started now under the sanitizer `runner` names: the verdict
    of the tool's own output first, then that of what ran under it."""
    assert check.seed is not None
    started = time.monotonic()
    try:
        link = (
            runner
            if isinstance(runner, RunnerLink)
            else _tool_link(session.step.problem.forbidden_libraries, runner, tool)
        )
    except OSError as exc:
        return Status.sandbox_error, f"compute-sanitizer {tool} could not be started: {exc}"
    deadline = _Deadline(link, TOOL_LIMIT_S)
    outcome: ShapeCheck | Fail | RunnerFailed
    try:
        outcome = _forward_under_tool(session, link, shape, check.seed)
    except (Fail, RunnerFailed) as exc:
        outcome = exc
    finally:
        deadline.cancel()
    run = link.finish_tool(max(FINISH_S, deadline.left()))
    report = sanitizer_report.parse(run.output, tool)
    check.findings += [locate(f, session.job.build_dir, session.step.code) for f in report.findings]
    ran_out = deadline.expired or (isinstance(outcome, RunnerFailed) and outcome.how == "timeout")
    status, message = tool_verdict(tool, run, report, check.findings, ran_out)
    if status == Status.passed:
        status, message = _run_verdict(tool, outcome)
    check.tools.append(
        MemoryToolRun(
            tool=tool,
            seconds=round(time.monotonic() - started, 3),  # a booted runner's wait for its turn is not the tool's
            exit_code=run.returncode,
            errors=report.errors,
            findings_not_printed=report.not_printed,
            verdict=status,
        )
    )
    return status, message


def tool_verdict(
    tool: MemoryTool, run: ToolRun, report: SanitizerReport, findings: list[MemoryFinding], ran_out: bool
) -> tuple[Status, str]:
    """What the tool's exit and its own output say, whatever the runner answered: an error it reported, or a run
    it could not vouch for (out of time, killed, no summary line, an odd exit)."""
    name = f"compute-sanitizer {tool}"
    errors = [f for f in findings if f.severity == "error"]
    if errors or run.returncode == ERROR_EXIT_CODE or (report.errors or 0) > 0:
        return Status.memory_error, finding_message(tool, errors, report.errors)
    if ran_out or run.timed_out:
        return Status.timeout, (
            f"{name} did not finish within {TOOL_LIMIT_S:.0f} s on the smallest correctness shape: the forward "
            "under it was killed (--no-memory-check skips the memory check)"
        )
    if run.signal:
        return Status.suspicious, f"{name} died of {run.signal} before its summary: no memory check verdict"
    if report.errors is None:
        said = "; ".join(report.tool_errors) or "nothing of its own"
        return Status.suspicious, (
            f"{name} ended (exit code {run.returncode}) without its summary line, so the forward under it was not "
            f"vouched for; the tool said: {said}"
        )
    if run.returncode != 0:
        return Status.suspicious, f"{name} reported no error but exited with code {run.returncode}"
    return Status.passed, ""


def finding_message(tool: MemoryTool, errors: list[MemoryFinding], counted: int | None) -> str:
    """The first error (an access before an API error), where it was and who made it, and how many followed."""
    total = max(counted or 0, len(errors))
    first = next((f for f in errors if f.kind != "api_error"), errors[0] if errors else None)
    if first is None:
        return f"compute-sanitizer {tool} reported {total or 'an'} error(s) but printed none the judge could read"
    text = f"compute-sanitizer {tool}: {first.access}"
    if first.kernel:
        text += f" in kernel {first.kernel.split('(')[0]}"
    if first.line is not None:
        text += f" at line {first.line} of the submission" + (f" ({first.excerpt.strip()})" if first.excerpt else "")
    elif first.location:
        text += f" at {first.location}"
    if first.thread:
        text += f", by {first.thread}"
    if first.detail:
        text += f": {first.detail}"
    if total > 1:
        text += f" ({total - 1} more error{'s' if total > 2 else ''})"
    return text


def _run_verdict(tool: MemoryTool, outcome: ShapeCheck | Fail | RunnerFailed) -> tuple[Status, str]:
    """The tool vouched for the run: now what ran under it must have answered, and right."""
    under = f"under compute-sanitizer {tool}"
    if isinstance(outcome, (Fail, RunnerFailed)):
        failure = as_failure(outcome, under)
        return failure.status, failure.message if isinstance(outcome, RunnerFailed) else f"{under}: {failure.message}"
    if outcome.status != Status.passed:
        return outcome.status, f"{under}, shape {outcome.shape}, seed {outcome.seed}: {outcome.message}"
    return Status.passed, ""


def _forward_under_tool(session: Session, link: RunnerLink, shape: ShapeSpec, seed: int) -> ShapeCheck:
    """Start and load the runner under the tool as any phase does, then one forward on a fresh input, judged."""
    compiled, tool_session = start(session.job, link, session.report)
    if tool_session is None:
        raise Fail(Status.sandbox_error, f"the runner under compute-sanitizer did not start: {compiled.message}")
    compiled = load(tool_session, compiled)
    if compiled.status != Status.passed:
        raise Fail(compiled.status, f"importing the submission: {compiled.message}")
    tool_session.seeds = session.seeds  # one sequence of seeds per job: a pinned --seed reruns this draw too
    expected = expected_for(tool_session, shape, seed)
    if expected.truth is None and tool_session.policy.name != "kernelbench":
        raise Fail(Status.sandbox_error, expected.truth_error)
    train = expected.gradients  # training mode: the backward runs under the tool too
    shared = share(
        session.device,
        expected.reference,
        [expected.inputs],
        expected.outputs,
        n_slots=1,
        staged=True,
        gradients=train.plan if train else None,
    )
    prepare(tool_session, "candidate", shape, expected.model_seed, shared)
    poison(shared.slot_views[0])
    synchronize(session.device)
    reference_s = max(expected.seconds, CALL_UNDER_TOOL_S / CALL_DEADLINE_FACTOR)
    called = tool_session.ask_call(Call(input_set=0, slot=0, timed=False), reference_s)
    outputs = take_outputs(called, shared.slot_views[0], "forward")
    gradients = []
    if train is not None:
        buffers = upload_upstream(session.device, shared, 0, train.upstreams[0])
        called = tool_session.ask_call(Backward(slot=0, timed=False), reference_s)
        gradients.append(take_outputs(called, buffers, "the backward"))
    verdict = judged(tool_session, shape, seed, expected, [outputs, outputs])
    if train is not None and verdict.status == Status.passed:
        judge_gradient_calls(tool_session.policy, train, gradients, verdict)
    forbidden = tool_session.forbidden()
    if forbidden:
        raise Fail(Status.forbidden_op, forbidden_message(forbidden))
    return verdict


def _tool_link(forbidden_libraries: Sequence[str], sanitizer: str, tool: MemoryTool) -> RunnerLink:
    wrapper = [
        sanitizer,
        "--tool", tool,
        "--error-exitcode", str(ERROR_EXIT_CODE),
        "--print-limit", str(PRINT_LIMIT),
        "--launch-timeout", "120",
        *TOOL_OPTIONS[tool],
    ]  # fmt: skip
    return RunnerLink(
        wrapper=wrapper,
        forbidden_libraries=list(forbidden_libraries),
        environment={"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"},  # the runner's allocations of their exact size
    )


class _Deadline:
    """Kills the tool and everything under it once its time is up, whichever request the judge is waiting on."""

    def __init__(self, link: RunnerLink, seconds: float):
        self.expired = False
        self._ends = time.monotonic() + seconds
        self._link = link
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def _expire(self) -> None:
        self.expired = True
        self._link.process.kill()

    def cancel(self) -> None:
        self._timer.cancel()

    def left(self) -> float:
        return max(0.0, self._ends - time.monotonic())


def locate(finding: MemoryFinding, build_dir: str, source: str) -> MemoryFinding:
    """The finding's line in the submitted source, where the tool named a file load_inline wrote (cuda.cu:12) in
    the build's folder."""
    if finding.location is None:
        return finding
    name, _, number = finding.location.rpartition(":")
    for generated in sorted(Path(build_dir).rglob(name)):
        line = submitted_line(str(generated), int(number), source)
        if line is not None:
            finding.line, finding.excerpt = line, excerpt(source, line)
            break
    return finding
