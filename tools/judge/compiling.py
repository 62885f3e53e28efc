"""The compile phase, and the start every phase begins with: the problem loaded in the judge and in the runner
before any candidate code runs, then the submission built and imported in the runner (`load`).

Failures are values: a runner that does not start, or a build that hangs or dies, ends as a status with a
message, never as an exception out of the judge.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from kernelloop.tools.jobs import WorkerJob
from kernelloop.tools.judge.device_state import DTYPES, device_of
from kernelloop.tools.judge.inputs import SeedSource
from kernelloop.tools.judge.operator_log import OperatorLog, Tampered
from kernelloop.tools.judge.runner_link import RunnerFailed, RunnerLink
from kernelloop.tools.judge.session import Fail, Report, Session, stopwatch
from kernelloop.tools.problems import import_problem_module, job_dtype, verdict_policy
from kernelloop.tools.results import CompileResult, Status
from kernelloop.tools.runner.messages import Load, Loaded, Start, Started

NO_OBSERVER = (
    "the operator observer's library is not available to the judge: the service could not build it (its log says "
    "why; it needs the C++ compiler builds use), and without it nothing is tested or timed"
)
LOAD_IDLE_LIMIT_S = 25.0  # building and importing may take minutes, but not this long with no build running


def compile_only_phase(job: WorkerJob, link: RunnerLink, report: Report) -> CompileResult:
    result, session = start(job, link, report)
    return result if session is None else load(session, result)


def _blank_compile(job: WorkerJob) -> CompileResult:
    return CompileResult(
        status=Status.passed,
        problem=job.step.problem.name,
        backend=job.step.backend,
        cache_key=job.cache_key,
        cache_hit=job.cache_hit,
    )


def start(job: WorkerJob, link: RunnerLink, report: Report) -> tuple[CompileResult, Session | None]:
    """Load the problem here and in the runner, before any candidate code runs; a test or a benchmark starts the
    operator observer there first."""
    result, step = _blank_compile(job), job.step
    operators: OperatorLog | None = None
    observer_fds: list[int] = []
    library = job.observer_library
    if step.phase != "compile":
        if not library:
            result.status, result.message = Status.sandbox_error, NO_OBSERVER
            return result, None
        operators, *observer_fds = OperatorLog.open()
    try:
        problem_module = import_problem_module(Path(step.problem.path))
        with stopwatch(result, "runner_start"), _closed_after(observer_fds):
            request = Start(
                problem_path=step.problem.path,
                backend=step.backend,
                timing=step.phase == "benchmark" or (step.phase == "profile" and link.tool is None),
                forbidden_libraries=list(step.problem.forbidden_libraries),
                observer_library=library if operators is not None else None,
            )
            started = link.ask(request, Started, 120, fds=observer_fds)
    except RunnerFailed as exc:
        result.status, result.message = Status.sandbox_error, f"the runner did not start: {exc}"
        return result, None
    except Exception as exc:
        result.status, result.message = Status.sandbox_error, f"the problem failed to load: {exc}"
        return result, None
    if started.error:
        result.status, result.message = Status.sandbox_error, started.error
        return result, None
    device = device_of(job)
    result.device = started.device
    precision = step.options.precision
    session = Session(
        job, link, report, device, problem_module, DTYPES.get(job_dtype(step.problem, precision), torch.float32),
        verdict_policy(step.problem, step.options.policy, precision), cast=precision is not None,
        launch_overhead_ms=started.launch_overhead_ms, seeds=SeedSource(step.options.seed), operators=operators,
    )  # fmt: skip
    return result, session


@contextmanager
def _closed_after(fds: list[int]) -> Iterator[None]:
    """The judge's copies of descriptors it sends: the runner holds its own once they are sent."""
    try:
        yield
    finally:
        for fd in fds:
            os.close(fd)


def load(session: Session, result: CompileResult) -> CompileResult:
    """Build and import the submission in the runner, and construct ModelNew for every shape there."""
    job, step = session.job, session.step
    request = Load(
        code=step.code,
        submission_path=job.submission_path,
        build_dir=job.build_dir,
        problem=step.problem.name,
        backend=step.backend,
        shapes=[s for s in step.problem.shapes if step.backend in s.backends],
        cache_key=job.cache_key,
        cache_hit=job.cache_hit,
        compile_only=step.phase == "compile",
        epoch=session.operators.new_token() if session.operators is not None else "",
    )
    limit_s = job.build_timeout_s
    started = time.monotonic()
    try:
        with stopwatch(result, "load"):
            loaded = session.link.ask(request, Loaded, limit_s, idle_limit_s=LOAD_IDLE_LIMIT_S).compile
    except RunnerFailed as exc:
        result.status = Status.timeout if exc.how == "timeout" else Status.runtime_error
        result.message = f"{exc} while building or importing the submission"
        if exc.how == "timeout" and time.monotonic() - started >= limit_s:
            result.message = (
                f"the build and import of the submission ran past their limit of {limit_s:.0f} s "
                "(KERNELLOOP_BUILD_TIMEOUT_S): the candidate's process was killed, its build with the job; make the "
                "build finish sooner (fewer or smaller sources, no step that waits)"
            )
        return result
    # what the runner may not speak for: which job, which problem, which cache entry, which device
    loaded.problem, loaded.backend, loaded.cache_key, loaded.cache_hit = (
        step.problem.name, step.backend, job.cache_key, job.cache_hit,
    )  # fmt: skip
    loaded.device, loaded.step_seconds = result.device, result.step_seconds
    if loaded.status == Status.passed:
        try:
            session.refuse_library_copies()
        except Fail as exc:
            loaded.status, loaded.message = exc.status, exc.message
    if session.operators is not None and loaded.status == Status.passed:
        try:
            session.operators.expect_epoch(request.epoch)
        except Tampered as exc:
            loaded.status = Status.suspicious
            loaded.message = f"the operator check was interfered with from the candidate's process: {exc}"
    return loaded
