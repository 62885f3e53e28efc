"""Inside the worker: the three phases, compile, test and benchmark. Each hands back one result object.

Failures are values: every exception a submission can raise ends as a status with a message that names
the shape, the seed, the element and the values involved. `report` sends the result-so-far to the
caller after every step, so if the process dies (segfault, illegal address, timeout) the caller still
knows how far it got.
"""

from __future__ import annotations

import copy
import inspect
import math
import secrets
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kernelloop.tools import build_cache, candidate, checking, devices, timing
from kernelloop.tools.diagnostics import python_error_diagnostics
from kernelloop.tools.jobs import WorkerJob
from kernelloop.tools.problems import ShapeSpec, import_problem_module
from kernelloop.tools.results import BenchmarkResult, CompileResult, ShapeBenchmark, ShapeCheck, Status, TestResult

Report = Callable[[Any], None]
DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16}


class Loaded:
    """What a successful compile phase hands to the later phases."""

    def __init__(self, problem_module: ModuleType, model_new: type[torch.nn.Module], device: torch.device):
        self.problem_module, self.model_new, self.device = problem_module, model_new, device


def _device(job: WorkerJob) -> torch.device:
    return torch.device("cuda" if job.backend == "cuda" else "cpu")


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".strip()


def compile_phase(job: WorkerJob, report: Report) -> tuple[CompileResult, Loaded | None]:
    """Build and import the submission, find ModelNew, and instantiate it for every shape."""
    result = CompileResult(
        status=Status.passed,
        problem=job.problem.name,
        backend=job.backend,
        cache_key=job.cache_key,
        cache_hit=job.cache_hit,
    )
    device = _device(job)
    has_device = device.type != "cuda" or torch.cuda.is_available()
    result.device = (
        _device_name(device) if has_device else "none (no GPU visible: built, imported and constructed on the CPU)"
    )
    try:
        problem_module = import_problem_module(Path(job.problem.path))
    except Exception as exc:
        result.status, result.message = Status.sandbox_error, f"the problem failed to load: {exc}"
        return result, None
    build_dir = Path(job.build_dir)
    started = time.perf_counter()
    try:
        module = candidate.import_submission(job.code, Path(job.submission_path))
        build_cache.mark_built(build_dir)  # the service keeps the build once the job has ended
    except BaseException as exc:  # SystemExit and KeyboardInterrupt from submitted code are failures too
        result.build_seconds = round(time.perf_counter() - started, 3)
        result.status = Status.compile_error
        result.diagnostics = python_error_diagnostics(exc, job.code, job.submission_path)
        first = next((d for d in result.diagnostics if d.severity == "error"), None)
        where = f"line {first.line}: " if first and first.line else ""
        result.message = where + (first.message if first else _error_text(exc))
        result.log = traceback.format_exc()
        return result, None
    result.build_seconds = round(time.perf_counter() - started, 3)
    model_new = candidate.model_new_class(module)
    if model_new is None:
        result.status, result.message = Status.missing_model_new, "the submission defines no class ModelNew(nn.Module)"
        return result, None
    shapes = [s for s in job.problem.shapes if job.backend in s.backends]
    for shape in shapes:
        try:
            inspect.signature(model_new).bind(*shape.init_inputs)
            model_new(*shape.init_inputs)
        except TypeError as exc:
            result.status = Status.signature_error
            result.message = (
                f"ModelNew{tuple(shape.init_inputs)} failed for shape {shape.name}: {exc}; ModelNew "
                f"must take the reference's constructor arguments {_signature(problem_module)}"
            )
            return result, None
        except Exception as exc:
            result.status = Status.runtime_error
            result.message = f"ModelNew{tuple(shape.init_inputs)} raised for shape {shape.name}: {_error_text(exc)}"
            return result, None
        result.shapes_instantiated.append(shape.name)
    if not has_device:
        if job.phase != "compile":
            result.status = Status.sandbox_error
            result.message = (
                "the cuda backend needs a GPU to test or time, and none is visible here; use the cpu backend"
            )
        return result, None
    return result, Loaded(problem_module, model_new, device)


def compile_only_phase(job: WorkerJob, report: Report) -> CompileResult:
    """The compile phase on its own: the verdict, without the loaded module the other phases go on with."""
    return compile_phase(job, report)[0]


def _signature(problem_module: ModuleType) -> str:
    return str(inspect.signature(problem_module.Model))


def _selected(shapes: list[ShapeSpec], names: list[str] | None) -> list[ShapeSpec]:
    return [s for s in shapes if names is None or s.name in names]


class _OpRecorder(TorchDispatchMode):
    """Records the aten operators a forward dispatches, C++ extension calls into ATen included."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(func._schema.name)
        return func(*args, **(kwargs or {}))


def _set_precision_policy(allow_tf32: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    torch.backends.cudnn.allow_tf32 = allow_tf32


def _release(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def _poison_free_memory(device: torch.device, like: list[torch.Tensor]) -> None:
    """Leave NaN in the memory the next allocation of these sizes will get, so a kernel that returns
    an unwritten buffer (torch::empty, or the reference's freed output) produces NaN, not stale truth."""
    _release(device)
    poison = [torch.full_like(t, float("nan")) if t.is_floating_point() else torch.empty_like(t) for t in like]
    del poison


def test_phase(job: WorkerJob, report: Report) -> TestResult:
    compiled, loaded = compile_phase(job, report)
    result = TestResult(
        status=compiled.status,
        message=compiled.message,
        problem=job.problem.name,
        backend=job.backend,
        device=compiled.device,
        compile=compiled,
        tolerance=job.problem.tolerance,
    )
    if loaded is None:
        return result
    report(result)
    _set_precision_policy(job.problem.tolerance.allow_tf32)
    dtype = DTYPES.get(job.problem.dtype, torch.float32)
    tol = job.problem.tolerance.max_rel_error
    ops: set[str] = set()
    for shape in _selected(job.problem.correctness_shapes(job.backend), job.options.shapes):
        seeds = [secrets.randbelow(2**31) for _ in range(job.options.seeds)]
        for seed in seeds:
            result.message = f"checking shape {shape.name}, seed {seed}"
            report(result)  # should the process die in this check, the caller can name the shape
            check = _check_one(job, loaded, shape, seed, dtype, tol, ops, result)
            result.checks.append(check)
            report(result)
            if check.status != Status.passed:
                result.status, result.message = check.status, f"shape {shape.name}, seed {seed}: {check.message}"
                result.ops_called = sorted(ops)
                return result
    result.ops_called = sorted(ops)
    forbidden = sorted(ops & set(job.problem.forbidden_ops))
    if forbidden:
        result.status = Status.forbidden_op
        result.message = f"ModelNew called {', '.join(forbidden)}: the reference's own operator may not do the work"
    else:
        result.status, result.message = Status.passed, f"{len(result.checks)} checks passed"
    return result


def _check_one(
    job: WorkerJob,
    loaded: Loaded,
    shape: ShapeSpec,
    seed: int,
    dtype: torch.dtype,
    tol: float,
    ops: set[str],
    result: TestResult,
) -> ShapeCheck:
    """Candidate on fresh (NaN-poisoned) memory, then the reference and the float64 truth, then the
    candidate again on poisoned memory; both candidate outputs must match the truth and each other."""
    device = loaded.device

    def fail(status: Status, message: str) -> ShapeCheck:
        return ShapeCheck(shape=shape.name, seed=seed, status=status, message=message)

    try:
        pair = candidate.build_pair(loaded.problem_module, loaded.model_new, shape, device, seed)
    except Exception as exc:
        return fail(Status.runtime_error, f"building the models raised {_error_text(exc)}")
    if not result.parameter_mapping:
        result.parameter_mapping = pair.parameter_mapping
    inputs = candidate.make_inputs(loaded.problem_module, shape, dtype, device, seed)
    with torch.no_grad():
        first_inputs = candidate.clone_inputs(inputs)
        reference_out = pair.reference(*candidate.clone_inputs(inputs))  # only to size the poison
        expected = checking.flatten_outputs(reference_out) or []
        shapes_only = [torch.empty_like(t) for t in expected]
        del reference_out, expected
        _poison_free_memory(device, shapes_only)
        try:
            recorder = _OpRecorder()
            with recorder:
                first = pair.candidate(*first_inputs)
            ops |= recorder.ops
            _release(device)
        except Exception as exc:
            return fail(Status.runtime_error, f"forward raised {_error_text(exc)}")
        mutated = checking.inputs_unchanged(inputs, first_inputs)
        if mutated:
            return fail(Status.input_mutated, mutated)
        reference_out = checking.flatten_outputs(pair.reference(*candidate.clone_inputs(inputs))) or []
        problem = checking.format_problem(first, reference_out)
        if problem:
            return fail(Status.wrong_output, problem)
        reference64 = copy.deepcopy(pair.reference).double()
        truth = (
            checking.flatten_outputs(
                reference64(
                    *[x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
                )
            )
            or []
        )
        del reference64
        reference_error = max(checking.relative_max_error(r, t) for r, t in zip(reference_out, truth))
        del reference_out
        _poison_free_memory(device, shapes_only)
        try:
            second = pair.candidate(*candidate.clone_inputs(inputs))
            _release(device)
        except Exception as exc:
            return fail(Status.runtime_error, f"second forward raised {_error_text(exc)}")
    check = checking.compare_outputs(first, truth, tol)
    again = checking.compare_outputs(second, truth, tol)
    if check.status == Status.passed and again.status != Status.passed:
        check = again
        check.message = "the second run, after the reference ran and its memory was freed: " + check.message
    elif check.status == Status.passed:
        drift = max(
            checking.relative_max_error(a, b.double())
            for a, b in zip(checking.flatten_outputs(first) or [], checking.flatten_outputs(second) or [])
        )
        if drift > tol:
            check.status = Status.nondeterministic
            check.message = f"two runs on one input differ by {drift:.3g} x max|output| (tolerance {tol:g}): a race?"
    check.shape, check.seed, check.reference_max_rel_error = shape.name, seed, reference_error
    if check.status == Status.passed and reference_error > tol / 2:
        check.status = Status.sandbox_error
        check.message = (
            f"the reference's own error {reference_error:.3g} leaves less than a 2x margin under the "
            f"tolerance {tol:g}: this problem's tolerance policy is too tight to judge by"
        )
    return check


def benchmark_phase(job: WorkerJob, report: Report) -> BenchmarkResult:
    compiled, loaded = compile_phase(job, report)
    result = BenchmarkResult(
        status=compiled.status,
        message=compiled.message,
        problem=job.problem.name,
        backend=job.backend,
        device=compiled.device,
        compile=compiled,
        timing_method=(
            "cuda events, L2 flush, interleaved, median; candidate bracketed by device-wide syncs"
            if job.backend == "cuda"
            else "perf_counter per call, interleaved, median"
        ),
    )
    if loaded is None:
        return result
    report(result)
    _set_precision_policy(job.problem.tolerance.allow_tf32)
    peaks = devices.gpu_peaks(compiled.device) if loaded.device.type == "cuda" else None
    for shape in _selected(job.problem.benchmark_shapes(job.backend), job.options.shapes):
        try:
            entry = _benchmark_one(job, loaded, shape, peaks)
        except Exception as exc:
            entry = ShapeBenchmark(shape=shape.name, status=Status.runtime_error, message=_error_text(exc))
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


def _on_input_set(model: Callable[..., Any], input_sets: list[list[Any]]) -> timing.Subject:
    """What the timer calls: the model on input set `i`."""
    return lambda i: model(*input_sets[i])


def _benchmark_one(
    job: WorkerJob, loaded: Loaded, shape: ShapeSpec, peaks: devices.DevicePeaks | None
) -> ShapeBenchmark:
    device, dtype = loaded.device, DTYPES.get(job.problem.dtype, torch.float32)
    seed = secrets.randbelow(2**31)
    pair = candidate.build_pair(loaded.problem_module, loaded.model_new, shape, device, seed)
    subjects: dict[str, Callable[..., Any]] = {"candidate": pair.candidate, "reference": pair.reference}
    if job.options.compare_torch_compile:
        subjects["compiled_reference"] = torch.compile(pair.reference)
    n_sets = 2
    input_sets = {
        name: [
            candidate.make_inputs(loaded.problem_module, shape, dtype, device, seed + 7919 * (k + 1) + i)
            for i in range(n_sets)
        ]
        for k, name in enumerate(subjects)
    }
    generator = torch.Generator(device=device).manual_seed(seed)

    def refresh(name: str, set_index: int) -> None:
        if shape.input_shapes is not None:
            candidate.refresh_inputs(input_sets[name][set_index], generator)

    with torch.no_grad():
        measured = timing.measure(
            {name: _on_input_set(model, input_sets[name]) for name, model in subjects.items()},
            refresh,
            n_sets,
            device,
            budget_s=job.options.time_budget_s,
            min_samples=job.options.min_samples,
            max_samples=job.options.max_samples,
            suspects=("candidate",),
        )
        problem = _check_timed_outputs(
            pair, input_sets["candidate"], measured.last_outputs["candidate"], job.problem.tolerance.max_rel_error
        )
    stats = {name: timing.summarize(s) for name, s in measured.samples_ms.items()}
    cand, ref = stats["candidate"], stats["reference"]
    entry = ShapeBenchmark(
        shape=shape.name,
        status=Status.passed,
        candidate=cand,
        reference=ref,
        compiled_reference=stats.get("compiled_reference"),
        speedup=ref.median_ms / cand.median_ms if cand.median_ms > 0 else None,
        outputs_checked=len(measured.last_outputs["candidate"]),
    )
    if entry.compiled_reference and cand.median_ms > 0:
        entry.speedup_vs_compiled = entry.compiled_reference.median_ms / cand.median_ms
    seconds = cand.median_ms / 1e3
    if seconds > 0:
        entry.tflops = shape.flops / seconds / 1e12 if shape.flops else None
        entry.gbps = shape.bytes / seconds / 1e9 if shape.bytes else None
    entry.memory_floor_ms, entry.floor_ms = devices.floors(
        peaks, shape.flops, shape.bytes, job.problem.tolerance.allow_tf32
    )
    if entry.floor_ms and cand.median_ms > 0:
        entry.fraction_of_floor = entry.floor_ms / cand.median_ms
    if problem:
        entry.status, entry.message = Status.suspicious, problem
    elif entry.memory_floor_ms and cand.median_ms < entry.memory_floor_ms:
        entry.status = Status.suspicious
        entry.message = (
            f"median {cand.median_ms:.4f} ms is under the memory floor {entry.memory_floor_ms:.4f} ms "
            f"({shape.bytes} bytes at {peaks.bandwidth_bytes_s / 1e12 if peaks else 0:.2f} TB/s): not a real speedup"
        )
    return entry


def _check_timed_outputs(
    pair: candidate.ModelPair, input_sets: list[list[Any]], outputs: dict[int, Any], tol: float
) -> str | None:
    """The last timed output of each input set must match the reference on that set's current contents;
    a kernel that caches results by pointer or by value fails here."""
    for set_index, got in outputs.items():
        expected = checking.flatten_outputs(pair.reference(*input_sets[set_index])) or []
        problem = checking.format_problem(got, expected)
        if problem:
            return f"timed output of input set {set_index}: {problem}"
        for g, e in zip(checking.flatten_outputs(got) or [], expected):
            error = checking.relative_max_error(g, e.double())
            if not error <= 2 * tol:
                return (
                    f"timed output of input set {set_index} is off by {error:.3g} x max|reference| "
                    f"(tolerance {2 * tol:g}): results were reused or computed wrong while timed"
                )
    return None
