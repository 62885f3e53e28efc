"""The tools as Python functions: compile_kernel, run_tests, benchmark and profile_kernel.

Each builds a `Step`, runs it in a fresh sandboxed worker (`run_phase`, which the service's executors call too),
and returns the worker's verdict. When the worker dies or hangs, the verdict is made here from the last result it
sent and how it ended, so the caller always gets a result object and never an exception for anything the
submission did. A call that is wrong itself (an unknown problem, shape names the phase does not have) raises
ProblemError before any worker starts.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar, cast

from kernelloop.tools.compilation import build_cache, object_cache, toolchain, verdict_cache
from kernelloop.tools.jobs import EvalOptions, Step, WorkerJob, WorkerReply
from kernelloop.tools.phase_registry import PHASES, Phase
from kernelloop.tools.problems import (
    ProblemSpec,
    check_shape_coverage,
    check_shape_names,
    job_dtype,
    load_problem,
    memory_problem,
    shipped_problems_dir,
)
from kernelloop.tools.results import (
    Backend,
    BenchmarkResult,
    CompileResult,
    PhaseResult,
    ProfileResult,
    SandboxReport,
    Status,
    TestResult,
    compile_part,
)
from kernelloop.tools.sandbox.gpu_lease import GpuBusy, free_memory_bytes, gpu_lease
from kernelloop.tools.sandbox.worker_call import JobFolder, WorkerCall, WorkerRequest, call_worker
from kernelloop.tools.sandbox.worker_pool import WorkerPool
from kernelloop.tools.settings import SandboxSettings, get_sandbox_settings

Progress = Callable[[PhaseResult], None]
"""Called with the result-so-far each time the worker reports a step (the service streams these)."""
Admission = Callable[[], AbstractContextManager[None]]
"""What a job is handed to its started worker under, and held until the worker ends: the GPU's lease."""
WORKER_MODULE = "kernelloop.tools.judge.worker"
CUDA_OUT_OF_MEMORY = "CUDA out of memory"
"""what torch's caching allocator says when the device has no room (torch.OutOfMemoryError)"""
ResultT = TypeVar("ResultT", bound=PhaseResult)


def default_backend() -> Backend:
    """cuda when a GPU is visible, else cpu."""
    return "cuda" if toolchain.gpu_arch() else "cpu"


@dataclass(frozen=True)
class PhaseTool(Generic[ResultT]):
    """A tool as a Python function: `run_tests(problem, code)` builds the phase's step, runs it in a fresh sandboxed
    worker and returns its result (what the phase does: `PHASES[phase].description`). The backend is by default
    `default_backend`, else this host's; the options by default `EvalOptions()`."""

    phase: Phase
    result_type: type[ResultT]
    default_backend: Backend | None = None

    def __call__(
        self,
        problem: ProblemSpec | str,
        code: str,
        backend: Backend | None = None,
        options: EvalOptions | None = None,
        settings: SandboxSettings | None = None,
        on_progress: Progress | None = None,
    ) -> ResultT:
        step = make_step(self.phase, problem, code, backend or self.default_backend, options)
        return cast(ResultT, run_phase(step, settings, on_progress))


compile_kernel = PhaseTool("compile", CompileResult)
"""Build and import the submission and instantiate ModelNew for every shape of the problem."""
run_tests = PhaseTool("test", TestResult)
"""Compile, then compare ModelNew with the float64 truth on every correctness shape and several seeds."""
benchmark = PhaseTool("benchmark", BenchmarkResult)
"""Compile, then time ModelNew against the reference on every benchmark shape."""
profile_kernel = PhaseTool("profile", ProfileResult, default_backend="cuda")
"""Compile, then profile one forward of ModelNew under Nsight Compute on one benchmark shape (`options.shapes`
names it; by default the problem's first): what the hardware saw, per kernel, and a summary. Advice, not a
verdict."""


def make_step(
    phase: Phase,
    problem: ProblemSpec | str,
    code: str,
    backend: Backend | None = None,
    options: EvalOptions | None = None,
) -> Step:
    """A step from a tool call's arguments: the problem by name or as a spec, the backend by default this host's
    (`default_backend`), the options by default `EvalOptions()`. Shape names the phase does not have raise
    ShapeSelectionError (`check_shape_names`), as the service answers 422 and the command line exits 2."""
    step = Step(
        phase=phase,
        problem=load_problem(problem) if isinstance(problem, str) else problem,
        code=code,
        backend=backend or default_backend(),
        options=options or EvalOptions(),
    )
    check_shape_names(step.problem, phase, step.backend, step.options.shapes)
    return step


def build_key(code: str, backend: Backend, settings: SandboxSettings) -> str:
    """The build cache's key for this code on this host's toolchain: what another host's build must match."""
    fingerprint = toolchain.toolchain_fingerprint(settings.cuda_arch_list, settings.cache_dir)
    return build_cache.cache_key(code, backend, fingerprint)


def run_phase(
    step: Step,
    settings: SandboxSettings | None = None,
    on_progress: Progress | None = None,
    pool: WorkerPool | None = None,
) -> PhaseResult:
    """Run one step in a sandboxed worker: what the tools above and the service's executor call (with its pool
    of workers started ahead). A step that would judge no shape (a test of no check would pass) raises
    ShapeSelectionError before any worker starts, however it was made."""
    check_shape_coverage(step.problem, step.phase, step.backend, step.options.shapes)
    result = _run_phase(step, settings or get_sandbox_settings(), on_progress, pool)
    result.dtype = job_dtype(step.problem, step.options.precision)
    if isinstance(result, (TestResult, BenchmarkResult)):
        result.mode = step.options.mode
    return result


def _run_phase(
    step: Step, settings: SandboxSettings, on_progress: Progress | None, pool: WorkerPool | None
) -> PhaseResult:
    fingerprint = toolchain.toolchain_fingerprint(settings.cuda_arch_list, settings.cache_dir)
    key = build_cache.cache_key(step.code, step.backend, fingerprint)
    too_large = _too_large(step, settings)
    if too_large is not None:
        return too_large
    if step.phase == "compile":
        reused = verdict_cache.load(settings.cache_dir, key, step.problem)
        if reused is not None:
            return reused
    if step.backend == "cuda" and step.phase != "compile":
        # built first, outside the GPU's lease; then timings and profiles alone on the GPU, checks side by side
        # where the device has room for them, and alone once more if they ran out of memory beside another job's
        unbuilt, build_s = _build_outside_the_lease(step, key, settings, pool)
        if unbuilt is not None:
            return unbuilt
        run = functools.partial(_call, step, key, settings, on_progress, pool)
        alone = step.phase != "test" or not _fits_beside_others(step, settings)
        judged = _on_the_gpu(step, settings, run, exclusive=alone)
        if out_of_device_memory(judged[0]):
            judged = _on_the_gpu(step, settings, run, exclusive=True)
        result, call = judged
        if build_s is not None:
            result.step_seconds["build_before_gpu_lease"] = build_s
        if call is None:
            return result
    else:
        call = _call(step, key, settings, on_progress, pool)
        result = _verdict(step, call, settings)
    compiled = compile_part(result)
    if compiled is not None:
        compiled.toolchain = fingerprint  # what the build cache keys on, from the host, never from the worker
        log = "\n".join(part for part in (compiled.log, call.report.stdout, call.report.stderr) if part)
        compiled.log_truncated = len(log.encode()) > settings.log_cap_bytes or call.report.output_truncated
        compiled.log = log.encode()[-settings.log_cap_bytes :].decode(errors="replace")
    if isinstance(result, CompileResult):
        verdict_cache.keep(settings.cache_dir, key, step.problem, result)
    return result


def _call(
    step: Step,
    key: str,
    settings: SandboxSettings,
    on_progress: Progress | None,
    pool: WorkerPool | None,
    admission: Admission | None = None,
) -> WorkerCall[WorkerReply]:
    """The step in a sandboxed worker, its build restored from the cache under `key` and published there
    afterwards (when it was built here and fits the job's disk limit); the job handed to the started worker under
    `admission` (the GPU's lease)."""
    read_only = _problem_folder_unless_shown(step.problem.path, settings)
    restored: list[bool] = []

    def make_job(folder: JobFolder) -> WorkerJob:
        restored.append(cached and build_cache.restore(settings.cache_dir, key, folder.build))
        return WorkerJob(
            step=step,
            nonce=folder.nonce,
            result_fd=-1,
            submission_path=str(folder.path / "submission.py"),
            build_dir=str(folder.build_seen_by_worker),
            observer_library=folder.observer_library,
            cache_key=key,
            cache_hit=restored[0],
            sent_at=time.time(),
            build_timeout_s=settings.build_timeout_s,
            nice=settings.build_nice if step.phase == "compile" else 0,
        )

    def on_reply(reply: WorkerReply) -> None:
        if on_progress is not None and not reply.final:
            on_progress(reply.result)

    def on_finish(folder: JobFolder, disk_bytes: int) -> None:
        object_cache.collect(folder.build)  # its misses, left by the compiler wrapper: never published
        if not restored[0] and disk_bytes <= settings.max_job_disk_bytes:
            build_cache.publish(settings.cache_dir, key, folder.build)

    with build_cache.claim(settings.cache_dir, key) as cached:
        request = WorkerRequest(
            WORKER_MODULE,
            make_job,
            WorkerReply,
            timeout_s=_timeout_s(step, settings),
            read_only=read_only,
            on_reply=on_reply,
            on_finish=on_finish,
            folder_prefix=step.phase,
            admission=admission,
        )
        return call_worker(request, settings, pool)


def _problem_folder_unless_shown(problem_path: str, settings: SandboxSettings) -> list[Path]:
    """The folder the worker imports the problem from, to be shown to it read-only; none when a folder every worker
    is shown holds it already (the package's, for a shipped problem; the service's registered problems, in
    `sandbox_read_only_paths`). A worker started ahead serves the next job of its kind, and a problem's own folder
    made every problem a kind of its own: a suite's jobs, one problem after another, each started its own worker,
    and the spares started for it were never used."""
    folder = Path(problem_path).resolve().parent
    shown = [Path(p).resolve() for p in settings.sandbox_read_only_paths]
    if folder.is_relative_to(shipped_problems_dir()) or any(folder.is_relative_to(p) for p in shown):
        return []
    return [folder]


def _build_outside_the_lease(
    step: Step, key: str, settings: SandboxSettings, pool: WorkerPool | None
) -> tuple[PhaseResult | None, float | None]:
    """A GPU step's build made by a compile step of its own before the step takes the GPU's lease, when the build
    cache does not hold it: a build is minutes of the CPUs' work, and under the lease it kept every benchmark and
    profile of the host waiting (and a benchmark's build, every test). Returns the step's result when the build
    failed (its compile part says why, as the step's own build would have), else None; and the build's seconds
    when one ran."""
    if build_cache.is_published(settings.cache_dir, key):
        return None, None
    started = time.monotonic()
    options = EvalOptions(timeout_s=step.options.timeout_s)
    compiled = _run_phase(step.model_copy(update={"phase": "compile", "options": options}), settings, None, pool)
    assert isinstance(compiled, CompileResult)
    if compiled.status == Status.passed:
        return None, round(time.monotonic() - started, 3)
    result = PHASES[step.phase].result_type(
        kind=step.phase, status=compiled.status, problem=step.problem.name, backend=step.backend,
        message=compiled.message, compile=compiled, device=compiled.device, sandbox=compiled.sandbox,
    )  # fmt: skip
    return result, round(time.monotonic() - started, 3)


def _fits_beside_others(step: Step, settings: SandboxSettings) -> bool:
    """Whether the test's largest check fits in what the device has free now. One that does not waits for the GPU
    alone, as a benchmark does (no test starts meanwhile, and those running end first), rather than start beside
    tests that hold the memory it needs and run out. A size not known ahead, or a free memory not readable, shares."""
    names = step.options.shapes
    shapes = [s for s in step.problem.correctness_shapes(step.backend) if not names or s.name in names]
    needs = [need for need in (s.check_bytes() for s in shapes) if need is not None]
    if not needs:
        return True
    free = free_memory_bytes(settings.worker_gpus)
    return free is None or max(needs) <= free


def out_of_device_memory(result: PhaseResult) -> bool:
    """A test that ran out of device memory, in the judge's own copies or in the candidate's forward. Tests share
    their GPU (several lanes, services or hosts' users on one device), so that says nothing of the kernel until it
    happens alone: such a test runs again with the GPU to itself, and that run's verdict is the one given."""
    if not isinstance(result, TestResult):
        return False
    return result.judge_out_of_memory or any(
        check.status == Status.runtime_error and CUDA_OUT_OF_MEMORY in check.message for check in result.checks
    )


def _on_the_gpu(
    step: Step, settings: SandboxSettings, run: Callable[[Admission], WorkerCall[WorkerReply]], *, exclusive: bool
) -> tuple[PhaseResult, WorkerCall[WorkerReply] | None]:
    """The step run (`run`) with its job handed to the worker under its GPU's lease
    (`kernelloop.tools.sandbox.gpu_lease`), and its call; no call when the GPU stayed busy past the step's time
    limit. The worker starts before the lease (an interpreter and torch, seconds of the CPUs' work and none of the
    GPU's), so the lease covers the job alone."""
    waited: list[float] = []

    @contextmanager
    def lease() -> Iterator[None]:
        wait_s = _timeout_s(step, settings)
        gpus, log, what = settings.worker_gpus, settings.gpu_lease_log, f"{step.phase} {step.problem.name}"
        with gpu_lease(gpus, settings.gpu_lease_dir, wait_s, exclusive=exclusive, log=log, what=what) as seconds:
            waited.append(seconds)
            yield

    try:
        call = run(lease)
    except GpuBusy as exc:
        return _harness_failure(step, str(exc)), None
    result = _verdict(step, call, settings)
    if waited and waited[0] >= 0.01:
        result.step_seconds["gpu_lease_wait"] = round(waited[0], 3)
    return result, call


def _timeout_s(step: Step, settings: SandboxSettings) -> float:
    return step.options.timeout_s or float(getattr(settings, PHASES[step.phase].timeout_setting))


def _harness_failure(step: Step, message: str) -> PhaseResult:
    """A step that did not run, for a reason of the harness's (never the kernel's): `sandbox_error`."""
    return PHASES[step.phase].result_type(
        kind=step.phase, status=Status.sandbox_error, problem=step.problem.name, backend=step.backend, message=message
    )


def _verdict(step: Step, call: WorkerCall[WorkerReply], settings: SandboxSettings) -> PhaseResult:
    """The worker's final result, or one made here from its last result-so-far and how it ended; then what the
    sandbox saw overrules it (a job it had to stop, a folder over the disk limit)."""
    report = call.report
    final = [r.result for r in call.replies if r.final]
    partial = [r.result for r in call.replies if not r.final]
    result = final[-1] if final else _verdict_without_reply(step, partial, report)
    if call.malformed and not final:
        result.status = Status.sandbox_error
        result.message = f"the worker's reply could not be read: {call.malformed[-1]}"
    if report.killed_for is not None:  # whatever it answered: a job the sandbox had to stop has failed
        result.status = Status.runtime_error
        result.message = f"the sandbox ended the job: {report.killed_for}"
    if call.disk_bytes > settings.max_job_disk_bytes:
        result.status = Status.sandbox_error
        result.message = (
            f"the job left {call.disk_bytes / 2**30:.1f} GiB in its folder, over the limit of "
            f"{settings.max_job_disk_bytes / 2**30:.1f} GiB (KERNELLOOP_MAX_JOB_DISK_BYTES)"
        )
    result.sandbox = report
    return result


def _too_large(step: Step, settings: SandboxSettings) -> PhaseResult | None:
    """A test or benchmark whose check would not fit in memory is refused before a worker starts (a harness
    failure, never the kernel's: the message says which shape and what to change)."""
    phase, backend = step.phase, step.backend
    if phase == "compile":
        return None
    limit = settings.max_check_bytes or (settings.max_memory_bytes if backend == "cpu" else None)
    if limit is None:
        return None
    where = "KERNELLOOP_MAX_CHECK_BYTES" if settings.max_check_bytes else "a worker (KERNELLOOP_MAX_MEMORY_BYTES)"
    problem = memory_problem(step.problem, backend, limit, where)
    if problem is None:
        return None
    return _harness_failure(step, f"{problem}: give the problem a smaller shape (the kernel was not run)")


def _verdict_without_reply(step: Step, partial: Sequence[PhaseResult], report: SandboxReport) -> PhaseResult:
    """The worker ended without a final result: a timeout, a crash or an exit from submitted code."""
    result = (
        partial[-1]
        if partial
        else PHASES[step.phase].result_type(
            kind=step.phase, status=Status.runtime_error, problem=step.problem.name, backend=step.backend
        )
    )
    where = _last_step(result)
    if report.timed_out:
        result.status = Status.timeout
        result.message = f"no result after {report.wall_seconds:.0f} s{where}: the worker was killed"
    else:
        how = f"signal {report.signal}" if report.signal else f"exit code {report.exit_code}"
        tail = report.stderr.strip().splitlines()[-3:]
        result.status = Status.runtime_error
        result.message = f"the worker died ({how}){where}" + (": " + " | ".join(tail) if tail else "")
        if report.killed_from_outside():  # the sandbox's own kills set timed_out or killed_for: not this one
            result.status = Status.sandbox_error
            result.message += (
                f"; the worker was killed by {report.signal} from outside the job, not by the sandbox's limits nor "
                "by the kernel (an operator, or the host's OOM killer when memory ran out): no verdict on the kernel"
            )
    return result


def _last_step(result: PhaseResult) -> str:
    """Where a partial result says the worker was: after which shape."""
    if isinstance(result, TestResult) and result.message.startswith("checking shape"):
        return f" while {result.message}" + (f", after {len(result.checks)} passed checks" if result.checks else "")
    if isinstance(result, TestResult) and result.checks:
        last = result.checks[-1]
        return f" after shape {last.shape} seed {last.seed} passed, during the next check"
    if isinstance(result, TestResult) and result.compile is not None:
        return " during the first correctness check"
    if isinstance(result, BenchmarkResult) and result.compile is not None:
        done = [s.shape for s in result.shapes]
        return f" while timing the shape after {done[-1]}" if done else " while timing the first shape"
    if isinstance(result, ProfileResult) and result.compile is not None and result.compile.ok:
        return f" while profiling shape {result.shape}"
    return " while building or importing the submission"
