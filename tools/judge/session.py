"""The session the judge's phases share (the job, the runner, the judge's own problem module and device) and
its failures as values: a check that fails raises `Fail`, whose status and message the phase reports.

The judge never imports, unpickles or calls anything the submission made. It owns the seeds, the reference
(whose parameters it copies to the candidate, `reference`), the float64 truth, the tolerance and the statistics;
the candidate runs in its runner (`kernelloop.tools.runner.serve`), reached through `RunnerLink`, and hands back
outputs written into the judge's shared buffers (`shared_buffers`), which the judge copies and checks, call by
call.
"""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import torch

from kernelloop.tools.jobs import Step, WorkerJob
from kernelloop.tools.judge.inputs import SeedSource
from kernelloop.tools.judge.operator_log import OperatorLog, Tampered
from kernelloop.tools.judge.runner_link import RunnerFailed, RunnerLink
from kernelloop.tools.problems import ShapeSpec
from kernelloop.tools.results import PhaseResult, Status, TolerancePolicy
from kernelloop.tools.runner import library_fence
from kernelloop.tools.runner.messages import Backward, Call, Called

Report = Callable[[PhaseResult], None]
"""Sends the result-so-far to the caller: after every step, so if the judge itself dies the caller still knows
how far it got."""
FIRST_CALL_DEADLINE_S = 25.0  # a candidate's first forward may JIT-compile (Triton) or create handles
CALL_DEADLINE_MIN_S = 10.0
CALL_DEADLINE_FACTOR = 100.0  # a call may take this many times the reference's time before it counts as hung


class Fail(Exception):
    """A check failed: the status and message the phase reports."""

    def __init__(self, status: Status, message: str):
        super().__init__(message)
        self.status, self.message = status, message


@dataclass
class Session:
    """What the phases share: the job, the runner, the judge's own problem module and device."""

    job: WorkerJob
    link: RunnerLink
    report: Report
    device: torch.device
    problem_module: ModuleType
    dtype: torch.dtype
    policy: TolerancePolicy
    cast: bool = False
    """KernelBench's precision option was given: the inputs and both models are cast to `dtype`"""
    launch_overhead_ms: float = 0.0
    calls_made: int = 0
    operators: OperatorLog | None = None
    """what the observer in the runner writes to the judge; None in a compile, which observes nothing"""
    seeds: SeedSource = field(default_factory=SeedSource)
    """every seed the judge draws (inputs, the models' initialization); never one the runner hears of for inputs"""

    @property
    def step(self) -> Step:
        return self.job.step

    @property
    def ops(self) -> set[str]:
        """The operators the candidate's process dispatched since its import began, as read so far."""
        return self.operators.ops if self.operators is not None else set()

    def ask_call(self, request: Call | Backward, reference_s: float) -> Called:
        """One forward (or, in training mode, backward) of the candidate's in the runner, with a deadline scaled to
        the reference's time; the observer's mark for it must follow on the judge's pipe."""
        deadline = max(CALL_DEADLINE_MIN_S, CALL_DEADLINE_FACTOR * reference_s)
        if self.calls_made == 0:
            deadline = max(deadline, FIRST_CALL_DEADLINE_S)
        self.calls_made += 1
        assert self.operators is not None
        request.mark = self.operators.new_token()
        called = self.link.ask(request, Called, deadline)
        with _tampering_fails():
            self.operators.expect_mark(request.mark, f"call {self.calls_made}")
        self.refuse_library_copies()
        return called

    def refuse_library_copies(self) -> None:
        """Fail the phase where a copy of a library the problem forbids lies where the candidate writes, or is
        mapped in its runner (`library_fence.copy_of`: by name)."""
        libraries = self.step.problem.forbidden_libraries
        folders = [Path.cwd(), Path(self.job.build_dir), Path("/tmp"), Path("/dev/shm")]
        copy = library_fence.copy_of(libraries, folders, Path(f"/proc/{self.link.process.pid}/maps"))
        if copy is not None:
            why = (
                f"{copy} is a copy of a library the problem forbids ({', '.join(libraries)}), which the candidate "
                "may not load: the problem asks for a kernel that does without it"
            )
            raise Fail(Status.forbidden_op, why)

    def forbidden(self) -> list[str]:
        """The forbidden operators the candidate's process dispatched since its import began, as the observer
        wrote them (a record that shows tampering fails the phase as `suspicious`)."""
        assert self.operators is not None
        with _tampering_fails():
            self.operators.refresh()
        patterns = self.step.problem.forbidden_ops
        return sorted(op for op in self.operators.ops if any(fnmatch.fnmatchcase(op, p) for p in patterns))


@contextmanager
def _tampering_fails() -> Iterator[None]:
    try:
        yield
    except Tampered as exc:
        why = f"the operator check was interfered with from the candidate's process: {exc}"
        raise Fail(Status.suspicious, why) from None


@contextmanager
def stopwatch(result: PhaseResult, name: str) -> Iterator[None]:
    """Add the time spent inside to `result.step_seconds[name]`, so every result says where its time went."""
    started = time.perf_counter()
    try:
        yield
    finally:
        spent = result.step_seconds.get(name, 0.0) + time.perf_counter() - started
        result.step_seconds[name] = round(spent, 3)


def selected(shapes: list[ShapeSpec], names: list[str] | None) -> list[ShapeSpec]:
    """The shapes the job named (its `options.shapes`), or every one where it named none."""
    return [s for s in shapes if names is None or s.name in names]


def as_failure(exc: Fail | RunnerFailed, where: str) -> Fail:
    """A failed check as it is, or a runner that hung or died as a timeout or runtime error `where` it did."""
    if isinstance(exc, Fail):
        return exc
    status = Status.timeout if exc.how == "timeout" else Status.runtime_error
    return Fail(status, f"{exc} {where}")


def harness_failure(what: str, exc: BaseException, remedy: str = "") -> str:
    """A failure on the judge's side, said as such, with what would let the problem be judged."""
    if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower():
        remedy = remedy or "the shape needs more memory than the device has: give the problem a smaller shape"
    else:
        remedy = remedy or "fix the problem file (its Model, get_inputs or get_init_inputs)"
    return f"{what} (the problem's side, not the kernel's): {_error_text(exc)[:500]}; {remedy}"


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".strip()


def forbidden_message(forbidden: list[str]) -> str:
    return f"ModelNew called {', '.join(forbidden)}: the reference's own operator may not do the work"


def answered(called: Called, what: str) -> None:
    """Raise the failure the runner's answer reports, if any."""
    if called.error:
        error = called.error.removeprefix("forward raised ").removeprefix("backward raised ")
        raise Fail(Status.runtime_error, f"{what} raised {error}")
    if called.output_problem:
        raise Fail(Status.wrong_output, called.output_problem)
