"""The three tools as Python functions: compile_kernel, run_tests and benchmark.

Each builds a job, runs it in a fresh sandboxed worker, and returns the worker's verdict. When the
worker dies or hangs, the verdict is made here from the last result it sent and how it ended, so the
caller always gets a result object and never an exception for anything the submission did.
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from kernelloop.tools import build_cache, sandbox, toolchain
from kernelloop.tools.jobs import EvalOptions, WorkerJob, WorkerReply
from kernelloop.tools.phase_registry import Phase
from kernelloop.tools.problems import ProblemSpec, load_problem
from kernelloop.tools.results import (
    Backend,
    BenchmarkResult,
    CompileResult,
    PhaseResult,
    SandboxReport,
    Status,
    TestResult,
)
from kernelloop.tools.settings import Settings, get_settings

RESULT_TYPES: dict[Phase, type[PhaseResult]] = {"compile": CompileResult, "test": TestResult, "benchmark": BenchmarkResult}
Progress = Callable[[PhaseResult], None]
"""Called with the result-so-far each time the worker reports a step (the service streams these)."""


def default_backend() -> Backend:
    """cuda when a GPU is visible, else cpu."""
    return "cuda" if toolchain.gpu_arch() else "cpu"


def compile_kernel(problem: ProblemSpec | str, code: str, backend: Backend | None = None,
                   options: EvalOptions | None = None, settings: Settings | None = None,
                   on_progress: Progress | None = None) -> CompileResult:
    """Build and import the submission and instantiate ModelNew for every shape of the problem."""
    return _run_phase("compile", problem, code, backend, options, settings, on_progress)  # type: ignore[return-value]


def run_tests(problem: ProblemSpec | str, code: str, backend: Backend | None = None,
              options: EvalOptions | None = None, settings: Settings | None = None,
              on_progress: Progress | None = None) -> TestResult:
    """Compile, then compare ModelNew with the float64 truth on every correctness shape and several seeds."""
    return _run_phase("test", problem, code, backend, options, settings, on_progress)  # type: ignore[return-value]


def benchmark(problem: ProblemSpec | str, code: str, backend: Backend | None = None,
              options: EvalOptions | None = None, settings: Settings | None = None,
              on_progress: Progress | None = None) -> BenchmarkResult:
    """Compile, then time ModelNew against the reference on every benchmark shape."""
    return _run_phase("benchmark", problem, code, backend, options, settings, on_progress)  # type: ignore[return-value]


def _timeout(phase: Phase, options: EvalOptions, settings: Settings) -> float:
    if options.timeout_s:
        return options.timeout_s
    return {"compile": settings.compile_timeout_s, "test": settings.test_timeout_s,
            "benchmark": settings.benchmark_timeout_s}[phase]


def _run_phase(phase: Phase, problem: ProblemSpec | str, code: str, backend: Backend | None,
               options: EvalOptions | None, settings: Settings | None, on_progress: Progress | None = None) -> PhaseResult:
    settings = settings or get_settings()
    options = options or EvalOptions()
    spec = load_problem(problem) if isinstance(problem, str) else problem
    backend = backend or default_backend()
    fingerprint = toolchain.toolchain_fingerprint(settings.cuda_arch_list)
    entry = build_cache.cache_entry(settings.cache_dir, code, backend, fingerprint)
    settings.jobs_dir.mkdir(parents=True, exist_ok=True)
    job_dir = Path(tempfile.mkdtemp(prefix=f"{phase}-", dir=settings.jobs_dir))
    nonce = secrets.token_hex(16)
    job = WorkerJob(phase=phase, problem=spec, code=code, backend=backend, options=options, nonce=nonce,
                    result_fd=-1, submission_path=str(job_dir / "submission.py"), build_dir=str(entry.path),
                    cache_key=entry.key, cache_hit=entry.hit)
    last: list[PhaseResult] = []
    final: list[PhaseResult] = []

    malformed: list[str] = []

    def on_message(line: bytes) -> None:
        try:
            reply = WorkerReply.model_validate_json(line)
        except ValueError as exc:
            if nonce.encode() in line:  # ours, yet unreadable: a harness bug must not pass as a crash
                malformed.append(str(exc)[:500])
            return  # otherwise not ours: a line without the job's nonce is ignored
        if reply.nonce == nonce:
            (final if reply.final else last).append(reply.result)
            if on_progress is not None and not reply.final:
                on_progress(reply.result)

    env = sandbox.worker_environment(toolchain.build_environment(settings), job_dir)
    try:
        report = sandbox.run_worker(job.model_dump_json().encode(), job_dir=job_dir, writable=[entry.path], env=env,
                                    timeout_s=_timeout(phase, options, settings), settings=settings,
                                    on_message=on_message)
    finally:
        shutil.rmtree(job_dir, ignore_errors=True)
    result = final[-1] if final else _verdict_without_reply(phase, spec.name, backend, last, report)
    if malformed and not final:
        result.status = Status.sandbox_error
        result.message = f"the worker's reply could not be read: {malformed[-1]}"
    result.sandbox = report
    if isinstance(result, CompileResult) or (result.__dict__.get("compile") is not None):
        compiled = result if isinstance(result, CompileResult) else result.compile  # type: ignore[attr-defined]
        compiled.toolchain = fingerprint  # what the build cache keys on, from the host, never from the worker
        log = "\n".join(part for part in (compiled.log, report.stdout, report.stderr) if part)
        compiled.log_truncated = len(log.encode()) > settings.log_cap_bytes or report.output_truncated
        compiled.log = log.encode()[-settings.log_cap_bytes:].decode(errors="replace")
    return result


def _verdict_without_reply(phase: Phase, problem: str, backend: Backend, partial: list[PhaseResult],
                           report: SandboxReport) -> PhaseResult:
    """The worker ended without a final result: a timeout, a crash or an exit from submitted code."""
    result = partial[-1] if partial else RESULT_TYPES[phase](status=Status.runtime_error, problem=problem, backend=backend)
    where = _last_step(result)
    if report.timed_out:
        result.status = Status.timeout
        result.message = f"no result after {report.wall_seconds:.0f} s{where}: the worker was killed"
    else:
        how = f"signal {report.signal}" if report.signal else f"exit code {report.exit_code}"
        tail = report.stderr.strip().splitlines()[-3:]
        result.status = Status.runtime_error
        result.message = f"the worker died ({how}){where}" + (": " + " | ".join(tail) if tail else "")
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
    return " while building or importing the submission"
