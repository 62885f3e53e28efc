"""The judge: the three phases, compile, test and benchmark, each handing back one result object.

The judge never imports, unpickles or calls anything the submission made. It owns the seeds, the reference
(whose parameters it copies to the candidate), the float64 truth, the tolerance and the statistics; the
candidate runs in its runner (`kernelloop.tools.runner.serve`), reached through `RunnerLink`, and hands back
outputs written into the judge's shared buffers, which the judge copies and checks, call by call.

Failures are values: every way a submission can fail ends as a status with a message that names the shape,
the seed, the element and the values involved. `report` sends the result-so-far to the caller after every
step, so if the judge itself dies the caller still knows how far it got.
"""

from __future__ import annotations

import copy
import fnmatch
import gc
import math
import os
import secrets
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

import torch

from kernelloop.tools.jobs import WorkerJob
from kernelloop.tools.judge import checking, devices, timing
from kernelloop.tools.judge.runner_link import RunnerFailed, RunnerLink
from kernelloop.tools.problems import (
    ShapeSpec,
    import_problem_module,
    job_dtype,
    kernelbench_policy,
    truth_policy,
    verdict_policy,
)
from kernelloop.tools.results import (
    BenchmarkResult,
    CompileResult,
    PhaseResult,
    ShapeBenchmark,
    ShapeCheck,
    Status,
    TestResult,
    TolerancePolicy,
)
from kernelloop.tools.runner import candidate
from kernelloop.tools.runner.messages import (
    Argument,
    Call,
    Called,
    Load,
    Loaded,
    Observe,
    Observed,
    Prepare,
    Prepared,
    SharedTensor,
    Start,
    Started,
)
from kernelloop.tools.runner.shared_tensors import SharedArena

Report = Callable[[Any], None]
DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16}
FIRST_CALL_DEADLINE_S = 25.0  # a candidate's first forward may JIT-compile (Triton) or create handles
CALL_DEADLINE_MIN_S = 10.0
CALL_DEADLINE_FACTOR = 100.0  # a call may take this many times the reference's time before it counts as hung
CALIBRATION_CALLS = 12
LARGE_CHECK_BYTES = 4 << 30
"""a check of a shape this large starts with the allocator's cache emptied when the device is short of free memory
for it: on the H200 a 6.4 GB KernelBench input ran out of memory with 96 GiB cached in blocks the next copies could
not reuse (CUDA's growable segments, which would reuse them, cannot be shared with the runner: their IPC needs
pidfd_getfd, which the sandbox refuses)"""
FREE_MEMORY_MARGIN = 2
"""a large check empties the cache when the device has less free than this many times what the check holds (the
judge's new copies, and the candidate's own memory beside them)"""
OTHER_VERDICT_MAX_CHECK_BYTES = 8 << 30
"""under the kernelbench policy, the float64 truth (for the strict policy's verdict beside it) is computed only for
shapes whose check holds at most this much: KernelBench's level 1 inputs reach 8 GiB, their truth twice that"""
LOAD_IDLE_LIMIT_S = 25.0  # building and importing may take minutes, but not this long with no build running
# How much shorter than the judge's envelope (less its calibrated overhead) a runner's reported median may be
# before the timing is `suspicious`. Honest kernels on the H200 left -0.11 to 0.30 ms a call unaccounted for (the
# judge's GPU work between the candidate's calls, which the calibration on the reference sees only in part), so
# the GPU margin is coarse: it catches lies of more than 0.6 ms or 5% a call, not subtler ones. On the 2-core CPU
# host the fixed cost itself (mostly the copy of the output into the judge's slot) was calibrated at 1.0 to 3.8 ms
# in runs of the same honest 13-24 ms kernel, leaving -0.7 to 1.9 ms unaccounted (up to 14%): the CPU margin is 25%.
# A short honest call there (an argmax of 0.49 ms) once left 0.28 ms unaccounted, the scheduler's noise on two
# shared cores: the CPU floor is 1 ms.
ENVELOPE_MARGIN_MS = {"cuda": 0.6, "cpu": 1.0}
ENVELOPE_MARGIN_REL = {"cuda": 0.05, "cpu": 0.25}


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
    ops: set[str] = field(default_factory=set)

    def ask_call(self, request: Call, reference_s: float) -> Called:
        """One forward in the runner, with a deadline scaled to the reference's time."""
        deadline = max(CALL_DEADLINE_MIN_S, CALL_DEADLINE_FACTOR * reference_s)
        if self.calls_made == 0:
            deadline = max(deadline, FIRST_CALL_DEADLINE_S)
        self.calls_made += 1
        return self.link.ask(request, Called, deadline)

    def observe(self) -> None:
        observed = self.link.ask(Observe(), Observed, CALL_DEADLINE_MIN_S)
        if observed.ops is None:
            raise Fail(Status.suspicious, "the operator observer was stopped from inside the candidate's process")
        self.ops |= set(observed.ops)

    def forbidden(self) -> list[str]:
        return sorted(op for op in self.ops if any(fnmatch.fnmatchcase(op, p) for p in self.job.problem.forbidden_ops))


@contextmanager
def _step(result: PhaseResult, name: str) -> Iterator[None]:
    """Add the time spent inside to `result.step_seconds[name]`, so every result says where its time went."""
    started = time.perf_counter()
    try:
        yield
    finally:
        spent = result.step_seconds.get(name, 0.0) + time.perf_counter() - started
        result.step_seconds[name] = round(spent, 3)


def _device(job: WorkerJob) -> torch.device:
    return torch.device("cuda" if job.backend == "cuda" and torch.cuda.is_available() else "cpu")


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".strip()


def _as_failure(exc: Fail | RunnerFailed, where: str) -> Fail:
    """A failed check as it is, or a runner that hung or died as a timeout or runtime error `where` it did."""
    if isinstance(exc, Fail):
        return exc
    status = Status.timeout if exc.how == "timeout" else Status.runtime_error
    return Fail(status, f"{exc} {where}")


# ---- compile ------------------------------------------------------------------------------------------------


def _blank_compile(job: WorkerJob) -> CompileResult:
    return CompileResult(
        status=Status.passed,
        problem=job.problem.name,
        backend=job.backend,
        cache_key=job.cache_key,
        cache_hit=job.cache_hit,
    )


def _start(job: WorkerJob, link: RunnerLink, report: Report) -> tuple[CompileResult, Session | None]:
    """Load the problem here and in the runner, before any candidate code runs."""
    result = _blank_compile(job)
    try:
        problem_module = import_problem_module(Path(job.problem.path))
        with _step(result, "runner_start"):
            start = Start(problem_path=job.problem.path, backend=job.backend, timing=job.phase == "benchmark")
            started = link.ask(start, Started, 120)
    except RunnerFailed as exc:
        result.status, result.message = Status.sandbox_error, f"the runner did not start: {exc}"
        return result, None
    except Exception as exc:
        result.status, result.message = Status.sandbox_error, f"the problem failed to load: {exc}"
        return result, None
    if started.error:
        result.status, result.message = Status.sandbox_error, started.error
        return result, None
    device = _device(job)
    result.device = started.device
    precision = job.options.precision
    session = Session(
        job, link, report, device, problem_module, DTYPES.get(job_dtype(job.problem, precision), torch.float32),
        verdict_policy(job.problem, job.options.policy, precision), cast=precision is not None,
        launch_overhead_ms=started.launch_overhead_ms,
    )  # fmt: skip
    return result, session


def _load(session: Session, result: CompileResult) -> CompileResult:
    """Build and import the submission in the runner, and construct ModelNew for every shape there."""
    job = session.job
    request = Load(
        code=job.code,
        submission_path=job.submission_path,
        build_dir=job.build_dir,
        problem=job.problem.name,
        backend=job.backend,
        shapes=[s for s in job.problem.shapes if job.backend in s.backends],
        cache_key=job.cache_key,
        cache_hit=job.cache_hit,
        compile_only=job.phase == "compile",
    )
    try:
        with _step(result, "load"):
            loaded = session.link.ask(request, Loaded, None, idle_limit_s=LOAD_IDLE_LIMIT_S).compile
    except RunnerFailed as exc:
        result.status = Status.timeout if exc.how == "timeout" else Status.runtime_error
        result.message = f"{exc} while building or importing the submission"
        return result
    # what the runner may not speak for: which job, which problem, which cache entry, which device
    loaded.problem, loaded.backend, loaded.cache_key, loaded.cache_hit = (
        job.problem.name, job.backend, job.cache_key, job.cache_hit,
    )  # fmt: skip
    loaded.device, loaded.step_seconds = result.device, result.step_seconds
    return loaded


def compile_only_phase(job: WorkerJob, link: RunnerLink, report: Report) -> CompileResult:
    result, session = _start(job, link, report)
    return result if session is None else _load(session, result)


# ---- test ---------------------------------------------------------------------------------------------------


def _selected(shapes: list[ShapeSpec], names: list[str] | None) -> list[ShapeSpec]:
    return [s for s in shapes if names is None or s.name in names]


def _set_precision_policy(policy: TolerancePolicy) -> None:
    """TF32 on or off for the judge's reference; the kernelbench policy keeps PyTorch's defaults, as KernelBench
    does (TF32 off for matmuls, on for cuDNN convolutions)."""
    kernelbench = policy.name == "kernelbench"
    torch.backends.cuda.matmul.allow_tf32 = policy.allow_tf32
    torch.backends.cudnn.allow_tf32 = True if kernelbench else policy.allow_tf32


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def test_phase(job: WorkerJob, link: RunnerLink, report: Report) -> TestResult:
    compiled, session = _start(job, link, report)
    if session is not None:
        compiled = _load(session, compiled)
    result = TestResult(
        status=compiled.status,
        message=compiled.message,
        problem=job.problem.name,
        backend=job.backend,
        device=compiled.device,
        compile=compiled,
        tolerance=verdict_policy(job.problem, job.options.policy, job.options.precision),
        step_seconds=compiled.step_seconds,
    )
    if session is None or compiled.status != Status.passed:
        return result
    report(result)
    _set_precision_policy(session.policy)
    trials = max(job.options.seeds, session.policy.min_trials)
    for shape in _selected(job.problem.correctness_shapes(job.backend), job.options.shapes):
        for seed in [secrets.randbelow(2**31) for _ in range(trials)]:
            result.message = f"checking shape {shape.name}, seed {seed}"
            report(result)  # should the judge die in this check, the caller can name the shape
            _make_room(session.device, shape.check_bytes())
            try:
                with _step(result, "checks"):
                    check = _check_one(session, shape, seed, result)
            except (Fail, RunnerFailed) as exc:
                failure = _as_failure(exc, "in forward")
                check = ShapeCheck(shape=shape.name, seed=seed, status=failure.status, message=failure.message)
            except (torch.OutOfMemoryError, MemoryError) as exc:  # in the judge's own copies or comparisons
                _free_device_memory(session.device)
                what = f"the judge ran out of memory checking shape {shape.name}"
                check = ShapeCheck(
                    shape=shape.name, seed=seed, status=Status.sandbox_error, message=_harness_failure(what, exc)
                )
            result.checks.append(check)
            _tally_other_verdicts(result, check)
            report(result)
            if check.status != Status.passed:
                result.status, result.message = check.status, f"shape {shape.name}, seed {seed}: {check.message}"
                result.ops_called = sorted(session.ops)
                return result
    result.ops_called = sorted(session.ops)
    forbidden = session.forbidden()
    if forbidden:
        result.status = Status.forbidden_op
        result.message = f"ModelNew called {', '.join(forbidden)}: the reference's own operator may not do the work"
    else:
        result.status, result.message = Status.passed, f"{len(result.checks)} checks passed"
        failed_elsewhere = {name: status for name, status in result.other_verdicts.items() if status != Status.passed}
        if failed_elsewhere:
            result.message += " (" + ", ".join(f"the {n} policy: {s.value}" for n, s in failed_elsewhere.items()) + ")"
    return result


def _make_room(device: torch.device, check_bytes: int | None) -> None:
    """Before a large check, empty the allocator's cache (the last check's copies, cached in blocks of other
    sizes) if the device has too little free for this one. Not before every large check: a causal conv1d test
    has six, and each emptying begins with a garbage collection of the judge (0.1 s on a 2-core machine)."""
    needed = check_bytes or 0
    if device.type != "cuda" or needed <= LARGE_CHECK_BYTES:
        return
    free, _ = torch.cuda.mem_get_info(device)
    if free < FREE_MEMORY_MARGIN * needed:
        _free_device_memory(device)


def _free_device_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _tally_other_verdicts(result: TestResult, check: ShapeCheck) -> None:
    """Keep, per other policy, passed or the status of its first failing check."""
    for name, status in check.verdicts.items():
        if result.tolerance is not None and name == result.tolerance.name:
            continue
        if result.other_verdicts.get(name, Status.passed) == Status.passed:
            result.other_verdicts[name] = status


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

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds.clear()


def _share(
    device: torch.device,
    reference: torch.nn.Module,
    input_sets: list[list[Any]],
    outputs: list[torch.Tensor],
    n_slots: int,
) -> Shared:
    arena, fds = SharedArena(device), list[int]()
    parameters = {name: arena.share(t.detach(), fds)[1] for name, t in candidate.state_tensors(reference).items()}
    arguments: list[list[Argument]] = []
    views: list[list[torch.Tensor | None]] = []
    for inputs in input_sets:
        row: list[Argument] = []
        view_row: list[torch.Tensor | None] = []
        for x in inputs:
            if isinstance(x, torch.Tensor):
                view, description = arena.share(x, fds)
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
    return Shared(arena, fds, parameters, arguments, views, slots, slot_views)


def _prepare(
    session: Session, model: Literal["candidate", "reference"], shape: ShapeSpec, seed: int, shared: Shared
) -> Prepared:
    request = Prepare(
        model=model,
        shape=shape,
        seed=seed,
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


def _poison(slots: list[torch.Tensor]) -> None:
    """Fill the output buffers with what no kernel computes: NaN, or an integer type's lowest value."""
    for slot in slots:
        if slot.is_floating_point():
            slot.fill_(float("nan"))
        elif slot.dtype == torch.bool:
            slot.zero_()
        else:
            slot.fill_(torch.iinfo(slot.dtype).min)


def _answered(called: Called, what: str) -> None:
    """Raise the failure the runner's answer reports, if any."""
    if called.error:
        raise Fail(Status.runtime_error, f"{what} raised {called.error.removeprefix('forward raised ')}")
    if called.output_problem:
        raise Fail(Status.wrong_output, called.output_problem)


def _take_outputs(called: Called, slots: list[torch.Tensor], what: str) -> list[torch.Tensor]:
    """The judge's private copy of what the runner wrote, once the runner has answered for it."""
    _answered(called, what)
    return [slot.clone() for slot in slots]


def _mutated(views: list[torch.Tensor | None], originals: list[Any]) -> str | None:
    return checking.inputs_unchanged(originals, [v if v is not None else o for v, o in zip(views, originals)])


def _check_one(session: Session, shape: ShapeSpec, seed: int, result: TestResult) -> ShapeCheck:
    """The candidate twice on one fresh input, each time into NaN-filled buffers, judged under the session's
    policy (against the float64 truth the judge computed from its own reference, or, under kernelbench, by
    allclose against that reference's own output); the two runs must agree. The other policy's verdict is
    computed beside it from the same outputs, where the models' mode makes no difference to the reference.
    Its time is kept in four parts (`checks.expected`, `.share`, `.calls`, `.compare`): where a test's time goes."""
    device, policy = session.device, session.policy
    with _step(result, "checks.expected"):
        expected = _expected(session, shape, seed)
    reference, inputs, reference_out, truth = expected.reference, expected.inputs, expected.outputs, expected.truth
    if truth is None and policy.name != "kernelbench":  # a policy that judges by the truth cannot judge at all
        raise Fail(Status.sandbox_error, expected.truth_error)
    with _step(result, "checks.share"):
        shared = _share(device, reference, [inputs], reference_out, n_slots=2)
        prepared = _prepare(session, "candidate", shape, seed, shared)
    if not result.parameter_mapping:
        result.parameter_mapping = prepared.parameter_mapping
    outputs = []
    for slot_index, what in ((0, "forward"), (1, "the second forward")):
        with _step(result, "checks.calls"):
            _poison(shared.slot_views[slot_index])
            _synchronize(device)
            called = session.ask_call(Call(input_set=0, slot=slot_index, timed=False), expected.seconds)
            outputs.append(_take_outputs(called, shared.slot_views[slot_index], what))
            mutated = _mutated(shared.input_views[0], inputs)
        if mutated:
            raise Fail(Status.input_mutated, mutated)
    session.observe()
    with _step(result, "checks.compare"):
        return _judged(session, shape, seed, expected, outputs)


def _judged(
    session: Session, shape: ShapeSpec, seed: int, expected: _Expected, outputs: list[list[torch.Tensor]]
) -> ShapeCheck:
    """The verdict on the candidate's two outputs for one input, under the session's policy and the other."""
    job, device, policy = session.job, session.device, session.policy
    tol = policy.max_rel_error
    reference_out, truth = expected.outputs, expected.truth
    reference_error = max((checking.relative_max_error(r, t) for r, t in zip(reference_out, truth or [])), default=0.0)
    first, second = outputs
    dtype = job_dtype(job.problem, job.options.precision)
    strict = truth_policy("fp32", dtype) if policy.name == "kernelbench" else policy

    def by_truth(out: list[torch.Tensor]) -> ShapeCheck:
        return checking.compare_outputs(out, truth or [], strict.max_rel_error)

    def by_kernelbench(out: list[torch.Tensor]) -> ShapeCheck:
        kernelbench = kernelbench_policy(dtype)
        return checking.compare_allclose(out, reference_out, kernelbench.atol or 0.0, kernelbench.rtol or 0.0)

    judge, other = (by_kernelbench, by_truth) if policy.name == "kernelbench" else (by_truth, by_kernelbench)
    check = judge(first)
    same_bits = all(torch.equal(a, b) for a, b in zip(first, second))  # a NaN never equals itself
    if check.status == Status.passed and not same_bits:  # the same bits would be judged the same, without drift
        again = judge(second)
        if again.status != Status.passed:
            check = again
            check.message = "the second run on the same input: " + check.message
        else:
            drift = max((checking.relative_max_error(a, b.double()) for a, b in zip(first, second)), default=0.0)
            if drift > tol:
                check.status = Status.nondeterministic
                check.message = (
                    f"two runs on one input differ by {drift:.3g} x max|output| (tolerance {tol:g}): a race?"
                )
    check.shape, check.seed = shape.name, seed
    check.reference_max_rel_error = reference_error if truth is not None else None
    if policy.name != "kernelbench" and reference_error > tol / 2:  # whatever the candidate did: not its fault
        check.status = Status.sandbox_error
        check.message = (
            f"the reference's own error {reference_error:.3g} x max|truth| leaves less than a 2x margin under the "
            f"tolerance {tol:g} on shape {shape.name}: a policy against the float64 truth cannot judge this problem "
            "(the problem's failure, not the kernel's); judge it with --policy kernelbench"
        )
    check.verdicts = {policy.name: check.status}
    if not expected.mode_matters and truth is not None:
        try:
            check.verdicts[strict.name if policy.name == "kernelbench" else "kernelbench"] = other(first).status
        except (torch.OutOfMemoryError, MemoryError):  # only said when cheap: this one was not
            _free_device_memory(device)
    return check


@dataclass
class _Expected:
    """The judge's side of one check: its reference, the inputs, the reference's output and the float64 truth."""

    reference: torch.nn.Module
    inputs: list[Any]
    outputs: list[torch.Tensor]
    seconds: float
    truth: list[torch.Tensor] | None
    truth_error: str
    mode_matters: bool
    """the reference's output changes with its mode (batch norm, dropout): the other policy's verdict would need
    runs of its own, so it is not given"""


def _expected(session: Session, shape: ShapeSpec, seed: int) -> _Expected:
    """Build the reference, draw the inputs, run it, and compute the float64 truth. A failure here is the
    judge's (the problem's, or the machine's), never the kernel's: `sandbox_error`, saying what to change."""
    device, policy = session.device, session.policy
    try:
        torch.manual_seed(seed)
        reference = _reference(session, shape)
        inputs = _inputs(session, shape, seed)
        with torch.no_grad():
            started = time.perf_counter()
            outputs = checking.flatten_outputs(reference(*candidate.clone_inputs(inputs))) or []
            _synchronize(device)
            seconds = time.perf_counter() - started
            in_other_mode = copy.deepcopy(reference).train(not policy.training_mode)
            other = checking.flatten_outputs(in_other_mode(*candidate.clone_inputs(inputs))) or []
            mode_matters = len(other) != len(outputs) or not all(torch.equal(a, b) for a, b in zip(other, outputs))
            del in_other_mode, other
    except Exception as exc:
        raise Fail(Status.sandbox_error, _harness_failure(f"the reference failed on shape {shape.name}", exc)) from exc
    truth, truth_error = None, ""
    if policy.name == "kernelbench" and (shape.check_bytes() or 0) > OTHER_VERDICT_MAX_CHECK_BYTES:
        return _Expected(reference, inputs, outputs, seconds, None, "", mode_matters)  # the other verdict: not cheap
    try:
        with torch.no_grad():
            reference64 = copy.deepcopy(reference).double()
            as64 = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
            truth = checking.flatten_outputs(reference64(*as64)) or []
            del reference64, as64
    except Exception as exc:
        truth_error = _harness_failure(
            f"the float64 truth of shape {shape.name} could not be computed", exc, "--policy kernelbench (which "
            "compares against the reference in its own precision) judges this problem without it"
        )  # fmt: skip
    return _Expected(reference, inputs, outputs, seconds, truth, truth_error, mode_matters)


def _harness_failure(what: str, exc: BaseException, remedy: str = "") -> str:
    """A failure on the judge's side, said as such, with what would let the problem be judged."""
    if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower():
        remedy = remedy or "the shape needs more memory than the device has: give the problem a smaller shape"
    else:
        remedy = remedy or "fix the problem file (its Model, get_inputs or get_init_inputs)"
    return f"{what} (the problem's side, not the kernel's): {_error_text(exc)[:500]}; {remedy}"


def _reference(session: Session, shape: ShapeSpec) -> torch.nn.Module:
    """The judge's reference for a shape, on the device, cast where the job asks for a precision, and in the mode
    the policy calls it: as constructed (training mode) or eval mode."""
    model = session.problem_module.Model(*shape.init_inputs).to(session.device)
    if session.cast:
        model = model.to(session.dtype)
    return model if session.policy.training_mode else model.eval()


def _inputs(session: Session, shape: ShapeSpec, seed: int) -> list[Any]:
    return candidate.make_inputs(session.problem_module, shape, session.dtype, session.device, seed, cast=session.cast)


# ---- benchmark ----------------------------------------------------------------------------------------------


def benchmark_phase(job: WorkerJob, link: RunnerLink, report: Report) -> BenchmarkResult:
    compiled, session = _start(job, link, report)
    result = BenchmarkResult(
        status=compiled.status,
        message=compiled.message,
        problem=job.problem.name,
        backend=job.backend,
        device=compiled.device,
        compile=compiled,
        step_seconds=compiled.step_seconds,
        timing_method=(
            "cuda events, L2 flush and persisting-L2 reset, interleaved, median; the candidate in its own "
            "process bracketed by device-wide syncs, every output checked, its time checked against the "
            "judge's envelope"
            if job.backend == "cuda"
            else "perf_counter per call, interleaved, median; the candidate in its own process, every output "
            "checked, its time checked against the judge's envelope"
        ),
    )
    if session is None:
        return result
    _set_precision_policy(session.policy)
    result.call_overhead_ms = session.launch_overhead_ms if session.device.type == "cuda" else None
    shapes = _selected(job.problem.benchmark_shapes(job.backend), job.options.shapes)
    try:
        with _step(result, "calibrate"):  # before the candidate's import
            overheads = {shape.name: _calibrate(session, shape) for shape in shapes}
    except (Fail, RunnerFailed) as exc:
        result.status, result.message = Status.sandbox_error, f"calibrating the envelope failed: {exc}"
        return result
    compiled.step_seconds = result.step_seconds
    compiled = result.compile = _load(session, compiled)
    result.status, result.message, result.device = compiled.status, compiled.message, compiled.device
    if compiled.status != Status.passed:
        return result
    report(result)
    peaks = devices.gpu_peaks(compiled.device) if session.device.type == "cuda" else None
    clock = timing.Clock(session.device)
    for shape in shapes:
        try:
            entry = _benchmark_one(session, clock, shape, overheads[shape.name], peaks, result)
        except (Fail, RunnerFailed) as exc:
            failure = _as_failure(exc, "in a timed forward")
            entry = ShapeBenchmark(shape=shape.name, status=failure.status, message=failure.message)
        except Exception as exc:  # raised in the judge's own process (the candidate runs in the runner's)
            _free_device_memory(session.device)
            message = _harness_failure(f"the judge failed timing shape {shape.name}", exc)
            entry = ShapeBenchmark(shape=shape.name, status=Status.sandbox_error, message=message)
        result.shapes.append(entry)
        report(result)
        if entry.status != Status.passed:
            result.status, result.message = entry.status, f"shape {shape.name}: {entry.message}"
            return result
    speedups = [s.speedup for s in result.shapes if s.speedup]
    result.geomean_speedup = math.exp(sum(math.log(s) for s in speedups) / len(speedups)) if speedups else None
    result.status = Status.passed
    result.message = (
        f"geometric mean speedup {result.geomean_speedup:.3f}x over {len(speedups)} shapes" if speedups else ""
    )
    return result


def _timed_output_off(got: torch.Tensor, want: torch.Tensor, policy: TolerancePolicy) -> str | None:
    """How far a timed output is from the reference's, when further than twice the policy's tolerance (as the
    policy measures it: allclose for kernelbench, relative to max|reference| for ours); None when within."""
    if policy.atol is not None and policy.rtol is not None and not checking.is_exact(want):
        if torch.allclose(got, want, atol=2 * policy.atol, rtol=2 * policy.rtol):
            return None
        error = (got.double() - want.double()).abs().max().item()
        return f"{error:.3g} at most, outside torch.allclose(atol={2 * policy.atol:g}, rtol={2 * policy.rtol:g})"
    error = checking.max_relative_difference(got, want)
    if error <= 2 * policy.max_rel_error:
        return None
    return f"{error:.3g} x max|reference| (tolerance {2 * policy.max_rel_error:g})"


def _shape_inputs(
    session: Session, shape: ShapeSpec, seed: int
) -> tuple[torch.nn.Module, list[list[Any]], list[torch.Tensor]]:
    """The judge's reference for a shape, two input sets, and the reference's output on the first."""
    try:
        torch.manual_seed(seed)
        reference = _reference(session, shape)
        input_sets = [_inputs(session, shape, seed + i) for i in range(2)]
        with torch.no_grad():
            outputs = checking.flatten_outputs(reference(*input_sets[0])) or []
    except Exception as exc:
        raise Fail(Status.sandbox_error, _harness_failure(f"the reference failed on shape {shape.name}", exc)) from exc
    if not outputs:
        raise Fail(Status.sandbox_error, f"the reference's forward for shape {shape.name} returned no tensor")
    return reference, input_sets, outputs


def _calibrate(session: Session, shape: ShapeSpec) -> float:
    """The envelope's fixed cost for this shape: the judge's wall time around a timed call, less the time
    the runner reports, measured on the reference in the runner before any candidate code was imported."""
    clock = timing.Clock(session.device)
    seed = secrets.randbelow(2**31)
    reference, input_sets, outputs = _shape_inputs(session, shape, seed)
    shared = _share(session.device, reference, input_sets, outputs, n_slots=len(input_sets))
    _prepare(session, "reference", shape, seed, shared)
    gaps = []
    for i in range(CALIBRATION_CALLS):
        clock.clear()
        called = session.link.ask(Call(input_set=i % 2, slot=i % 2, timed=True), Called, 120)
        if called.error or called.elapsed_ms is None:
            raise Fail(Status.sandbox_error, f"the reference failed in the runner: {called.error}")
        gaps.append(session.link.last_envelope_ms - called.elapsed_ms)
    return statistics.median(gaps[2:])


@dataclass
class _Tally:
    """The candidate's reported times and the judge's envelopes, call by call."""

    reported: list[float] = field(default_factory=list)
    envelope: list[float] = field(default_factory=list)
    checked: int = 0


def _benchmark_one(
    session: Session,
    clock: timing.Clock,
    shape: ShapeSpec,
    overhead_ms: float,
    peaks: devices.DevicePeaks | None,
    result: BenchmarkResult,
) -> ShapeBenchmark:
    job, device = session.job, session.device
    seed = secrets.randbelow(2**31)
    reference, private_sets, outputs = _shape_inputs(session, shape, seed)
    shared = _share(device, reference, private_sets, outputs, n_slots=len(private_sets))
    _prepare(session, "candidate", shape, seed, shared)
    subjects_trusted: dict[str, torch.nn.Module | Callable[..., Any]] = {"reference": reference}
    if job.options.compare_torch_compile:
        subjects_trusted["compiled_reference"] = torch.compile(reference)
    generator = torch.Generator(device=device).manual_seed(seed)
    expected: dict[int, list[torch.Tensor]] = {}
    tally = _Tally()
    reference_s = [1.0]

    def redraw(set_index: int) -> None:
        candidate.refresh_inputs(private_sets[set_index], generator)
        for view, x in zip(shared.input_views[set_index], private_sets[set_index]):
            if view is not None:
                view.copy_(x)
        _poison(shared.slot_views[set_index])
        _synchronize(device)

    def trusted(name: str) -> Callable[[int], float]:
        def run(set_index: int) -> float:
            with torch.no_grad():
                elapsed, out = clock.time(lambda: subjects_trusted[name](*private_sets[set_index]))
            if name == "reference":
                expected[set_index] = checking.flatten_outputs(out) or []
                reference_s[0] = elapsed / 1e3
            return elapsed

        return run

    def remote(set_index: int) -> float:
        clock.clear()
        called = session.ask_call(Call(input_set=set_index, slot=set_index, timed=True), reference_s[0])
        envelope_ms = session.link.last_envelope_ms
        _answered(called, "a timed forward")
        if called.elapsed_ms is None or not math.isfinite(called.elapsed_ms) or called.elapsed_ms < 0:
            raise Fail(Status.suspicious, f"the runner reported no usable time ({called.elapsed_ms})")
        tally.reported.append(called.elapsed_ms)
        tally.envelope.append(envelope_ms - overhead_ms)
        return called.elapsed_ms

    def check_round(set_index: int) -> None:
        mutated = _mutated(shared.input_views[set_index], private_sets[set_index])
        if mutated:
            raise Fail(Status.input_mutated, f"timed call {tally.checked + 1}: {mutated}")
        for got, want in zip(shared.slot_views[set_index], expected[set_index]):
            off = _timed_output_off(got, want, session.policy)
            if off is not None:
                raise Fail(
                    Status.suspicious,
                    f"timed call {tally.checked + 1} (input set {set_index}) is off by {off}: its output was not "
                    "computed from that call's input within the call",
                )
        tally.checked += 1

    subjects = {name: trusted(name) for name in subjects_trusted}
    subjects["candidate"] = remote
    with _step(result, "timing"):
        samples = timing.measure(
            subjects,
            before_round=redraw,
            after_round=check_round,
            n_sets=len(private_sets),
            budget_s=job.options.time_budget_s,
            min_samples=job.options.min_samples,
            max_samples=job.options.max_samples,
        )
    session.observe()
    forbidden = session.forbidden()
    if forbidden:
        raise Fail(
            Status.forbidden_op,
            f"ModelNew called {', '.join(forbidden)}: the reference's own operator may not do the work",
        )
    stats = {name: timing.summarize(s) for name, s in samples.items()}
    cand, ref = stats["candidate"], stats["reference"]
    entry = ShapeBenchmark(
        shape=shape.name,
        status=Status.passed,
        candidate=cand,
        reference=ref,
        compiled_reference=stats.get("compiled_reference"),
        speedup=ref.median_ms / cand.median_ms if cand.median_ms > 0 else None,
        outputs_checked=tally.checked,
        envelope=timing.summarize(tally.envelope),
        envelope_overhead_ms=overhead_ms,
    )
    if entry.compiled_reference and cand.median_ms > 0:
        entry.speedup_vs_compiled = entry.compiled_reference.median_ms / cand.median_ms
    seconds = cand.median_ms / 1e3
    if seconds > 0:
        entry.tflops = shape.flops / seconds / 1e12 if shape.flops else None
        entry.gbps = shape.bytes / seconds / 1e9 if shape.bytes else None
    entry.memory_floor_ms, entry.floor_ms = devices.floors(peaks, shape.flops, shape.bytes, session.policy.allow_tf32)
    if entry.floor_ms and cand.median_ms > 0:
        entry.fraction_of_floor = entry.floor_ms / cand.median_ms
    unaccounted = statistics.median(e - r for e, r in zip(tally.envelope, tally.reported))
    entry.unaccounted_ms = unaccounted
    margin = max(ENVELOPE_MARGIN_MS[job.backend], ENVELOPE_MARGIN_REL[job.backend] * cand.median_ms)
    if unaccounted > margin:
        entry.status = Status.suspicious
        entry.message = (
            f"the runner reported a median of {cand.median_ms:.4f} ms, but the judge's own clock around each call "
            f"accounts for {statistics.median(tally.envelope):.4f} ms after the calibrated overhead "
            f"({overhead_ms:.4f} ms): {unaccounted:.4f} ms a call unaccounted for (margin {margin:.4f} ms)"
        )
    elif entry.memory_floor_ms and cand.median_ms < entry.memory_floor_ms:
        entry.status = Status.suspicious
        entry.message = (
            f"median {cand.median_ms:.4f} ms is under the memory floor {entry.memory_floor_ms:.4f} ms "
            f"({shape.bytes} bytes at {peaks.bandwidth_bytes_s / 1e12 if peaks else 0:.2f} TB/s): not a real speedup"
        )
    return entry
