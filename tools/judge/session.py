"""What the judge's phases share: the session (the job, the runner, the judge's own problem module and device),
failures as values, the judge's reference and inputs, the device's memory, and the buffers shared with the runner.

The judge never imports, unpickles or calls anything the submission made. It owns the seeds, the reference
(whose parameters it copies to the candidate), the float64 truth, the tolerance and the statistics; the
candidate runs in its runner (`kernelloop.tools.runner.serve`), reached through `RunnerLink`, and hands back
outputs written into the judge's shared buffers, which the judge copies and checks, call by call.
"""

from __future__ import annotations

import fnmatch
import gc
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

import torch

from kernelloop.tools.jobs import Step, WorkerJob
from kernelloop.tools.judge import checking
from kernelloop.tools.judge import inputs as problem_inputs
from kernelloop.tools.judge.inputs import SeedSource
from kernelloop.tools.judge.operator_log import OperatorLog, Tampered
from kernelloop.tools.judge.runner_link import RunnerFailed, RunnerLink
from kernelloop.tools.problems import ShapeSpec
from kernelloop.tools.results import PhaseResult, Status, TolerancePolicy
from kernelloop.tools.runner import candidate, library_fence
from kernelloop.tools.runner.messages import (
    Argument,
    Call,
    Called,
    Prepare,
    Prepared,
    SharedTensor,
)
from kernelloop.tools.runner.shared_tensors import SharedArena

Report = Callable[[PhaseResult], None]
"""Sends the result-so-far to the caller: after every step, so if the judge itself dies the caller still knows
how far it got."""
DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16}
FIRST_CALL_DEADLINE_S = 25.0  # a candidate's first forward may JIT-compile (Triton) or create handles
CALL_DEADLINE_MIN_S = 10.0
CALL_DEADLINE_FACTOR = 100.0  # a call may take this many times the reference's time before it counts as hung
LARGE_CHECK_BYTES = 4 << 30
"""a check of a shape this large starts with the allocator's cache emptied when the device is short of free memory
for it: on the H200 a 6.4 GB KernelBench input ran out of memory with 96 GiB cached in blocks the next copies could
not reuse (CUDA's growable segments, which would reuse them, cannot be shared with the runner: their IPC needs
pidfd_getfd, which the sandbox refuses)"""
FREE_MEMORY_MARGIN = 2
"""a large check empties the cache when the device has less free than this many times what the check holds (the
judge's new copies, and the candidate's own memory beside them)"""


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

    def ask_call(self, request: Call, reference_s: float) -> Called:
        """One forward of the candidate's in the runner, with a deadline scaled to the reference's time; the
        observer's mark for it must follow on the judge's pipe."""
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


def device_of(job: WorkerJob) -> torch.device:
    return torch.device("cuda" if job.step.backend == "cuda" and torch.cuda.is_available() else "cpu")


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


# ---- the judge's device, its precision and its memory -------------------------------------------------------


def selected(shapes: list[ShapeSpec], names: list[str] | None) -> list[ShapeSpec]:
    return [s for s in shapes if names is None or s.name in names]


def set_precision_policy(policy: TolerancePolicy) -> None:
    """TF32 on or off for the judge's reference; the kernelbench policy keeps PyTorch's defaults, as KernelBench
    does (TF32 off for matmuls, on for cuDNN convolutions)."""
    kernelbench = policy.name == "kernelbench"
    torch.backends.cuda.matmul.allow_tf32 = policy.allow_tf32
    torch.backends.cudnn.allow_tf32 = True if kernelbench else policy.allow_tf32


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def make_room(device: torch.device, check_bytes: int | None) -> None:
    """Before a large check, empty the allocator's cache (the last check's copies, cached in blocks of other
    sizes) if the device has too little free for this one. Not before every large check: a causal conv1d test
    has six, and each emptying begins with a garbage collection of the judge (0.1 s on a 2-core machine)."""
    needed = check_bytes or 0
    if device.type != "cuda" or needed <= LARGE_CHECK_BYTES:
        return
    free, _ = torch.cuda.mem_get_info(device)
    if free < FREE_MEMORY_MARGIN * needed:
        free_device_memory(device)


def free_device_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ---- the judge's reference and inputs -----------------------------------------------------------------------


@contextmanager
def reference_on(shape: ShapeSpec) -> Iterator[None]:
    """Inside, what fails is the judge's side of `shape` (the problem's reference, its inputs): sandbox_error."""
    try:
        yield
    except Exception as exc:
        raise Fail(Status.sandbox_error, harness_failure(f"the reference failed on shape {shape.name}", exc)) from exc


def reference_outputs(reference: torch.nn.Module, inputs: list[Any], shape: ShapeSpec) -> list[torch.Tensor]:
    """The reference's outputs on one input set: the shapes of the candidate's output slots."""
    with reference_on(shape), torch.no_grad():
        outputs = checking.flatten_outputs(reference(*inputs)) or []
    if not outputs:
        raise Fail(Status.sandbox_error, f"the reference's forward for shape {shape.name} returned no tensor")
    return outputs


def reference_model(session: Session, shape: ShapeSpec, model_seed: int) -> torch.nn.Module:
    """The judge's reference for a shape, built on the device under `model_seed`, cast where the job asks for a
    precision, and in the mode the policy calls it: as constructed (training mode) or eval mode."""
    model = candidate.build_model(session.problem_module.Model, shape.init_inputs, session.device, model_seed)
    if session.cast:
        model = model.to(session.dtype)
    return model if session.policy.training_mode else model.eval()


def draw_inputs(session: Session, shape: ShapeSpec, seed: int) -> list[Any]:
    return problem_inputs.draw_inputs(
        session.problem_module, shape, session.dtype, session.device, seed, cast=session.cast
    )


def redraws(session: Session, shape: ShapeSpec) -> problem_inputs.Redraws:
    """The input sets of one shape's timed rounds, drawn as the problem draws them, under the session's seeds."""
    return problem_inputs.Redraws(
        session.problem_module, shape, session.dtype, session.device, session.cast, session.seeds
    )


def seeded_reference(session: Session, shape: ShapeSpec) -> tuple[torch.nn.Module, int, problem_inputs.Redraws]:
    """The reference of `shape` built under a fresh model seed (the runner is told it, to build the candidate with
    the same parameters), the seed, and the redraws of the shape's inputs; a failure is the judge's side."""
    model_seed = session.seeds.model_seed(session.seeds.draw())
    with reference_on(shape):
        return reference_model(session, shape, model_seed), model_seed, redraws(session, shape)


# ---- the buffers shared with the runner ---------------------------------------------------------------------


@dataclass
class Shared:
    """One shape's buffers as shared with the runner, beside the judge's private originals."""

    arena: SharedArena
    fds: list[int]
    parameters: dict[str, SharedTensor]
    input_sets: list[list[Argument]]
    input_views: list[list[torch.Tensor | None]]
    slots: list[list[SharedTensor]]
    slot_views: list[list[torch.Tensor]]
    staging: SharedArena | None = None
    """host memory holding the parameters and inputs, when they were staged there (`share(..., staged=True)`)"""

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds.clear()


def share(
    device: torch.device,
    reference: torch.nn.Module,
    input_sets: list[list[Any]],
    outputs: list[torch.Tensor],
    n_slots: int,
    staged: bool = False,
) -> Shared:
    """The reference's parameters, the input sets and `n_slots` output buffers, shared with the runner. `staged`:
    the parameters and inputs in host memory, which a GPU runner copies onto its device into memory of its own
    (`kernelloop.tools.runner.shared_tensors.open_shared`), as a memory checker must see it written."""
    arena, fds = SharedArena(device), list[int]()
    staging = SharedArena(torch.device("cpu")) if staged else None
    given = staging or arena
    parameters = {name: given.share(t.detach(), fds)[1] for name, t in candidate.state_tensors(reference).items()}
    arguments: list[list[Argument]] = []
    views: list[list[torch.Tensor | None]] = []
    for inputs in input_sets:
        row: list[Argument] = []
        view_row: list[torch.Tensor | None] = []
        for x in inputs:
            if isinstance(x, torch.Tensor):
                view, description = given.share(x, fds)
                row.append(Argument(tensor=description))
                view_row.append(view)
            else:
                row.append(Argument(value=x))
                view_row.append(None)
        arguments.append(row)
        views.append(view_row)
    slots, slot_views = [], []
    for _ in range(n_slots):
        pairs = [arena.new(tuple(o.shape), o.dtype, fds) for o in outputs]
        slot_views.append([view for view, _ in pairs])
        slots.append([description for _, description in pairs])
    return Shared(arena, fds, parameters, arguments, views, slots, slot_views, staging)


def prepare(
    session: Session, model: Literal["candidate", "reference"], shape: ShapeSpec, init_seed: int, shared: Shared
) -> Prepared:
    """Build `model` in the runner under `init_seed` (the seed the judge built its reference under), with the
    judge's parameters and the shared buffers."""
    request = Prepare(
        model=model,
        shape=shape,
        init_seed=init_seed,
        parameters=shared.parameters,
        input_sets=shared.input_sets,
        output_slots=shared.slots,
        training_mode=session.policy.training_mode,
        cast_to=str(session.dtype).removeprefix("torch.") if session.cast else None,
    )
    prepared = session.link.ask(request, Prepared, 120, fds=shared.fds)
    shared.close()  # the runner holds its own copies of the descriptors now
    if prepared.error:
        raise Fail(Status.runtime_error, prepared.error)
    return prepared


def poison(slots: list[torch.Tensor]) -> None:
    """Fill the output buffers with what no kernel computes: NaN, or an integer type's lowest value."""
    for slot in slots:
        if slot.is_floating_point():
            slot.fill_(float("nan"))
        elif slot.dtype == torch.bool:
            slot.zero_()
        else:
            slot.fill_(torch.iinfo(slot.dtype).min)


def answered(called: Called, what: str) -> None:
    """Raise the failure the runner's answer reports, if any."""
    if called.error:
        raise Fail(Status.runtime_error, f"{what} raised {called.error.removeprefix('forward raised ')}")
    if called.output_problem:
        raise Fail(Status.wrong_output, called.output_problem)


def mutated(views: list[torch.Tensor | None], originals: list[Any]) -> str | None:
    return checking.inputs_unchanged(originals, [v if v is not None else o for v, o in zip(views, originals)])
