"""Entry point of a problem check: `python -m kernelloop.tools.judge.problem_worker RESULT_FD`, the job on stdin.

It loads an uploaded problem file as `kernelloop.tools.problems` would (which sizes every shape on torch's meta
device, allocating nothing), builds Model for every shape and calls get_inputs() where the shapes leave the
inputs to it, and sends the resulting ProblemSpec (or what failed) back on the private pipe, tagged with the
job's nonce. Nothing in the file runs in the service, and nothing of it runs with a capability: the worker gives up
the one every sandboxed worker starts with (`kernelloop.tools.judge.capabilities`, the judge's for its runner)
before anything else.

Sizes come first: a shape whose parameters, inputs and output (as the meta device measured them) exceed
EXERCISE_MAX_BYTES is exercised on the meta device only, so a problem made for a large GPU registers on a CPU
lane without allocating what the lane does not have (KernelBench's level 1 reaches 8 GiB inputs and 4 GiB
weights); whether it fits a device here is the service's question, asked of those sizes. An allocation that
fails while exercising a shape is reported as what it is, with the sizes, never as a malformed file.
"""

from __future__ import annotations

import copy
import os
import sys
import time
import traceback
from pathlib import Path
from types import ModuleType

from kernelloop.tools import code_coverage
from kernelloop.tools.jobs import ProblemCheckJob, ProblemCheckReply
from kernelloop.tools.judge import capabilities
from kernelloop.tools.problems import ProblemSpec, ShapeSpec

EXERCISE_MAX_BYTES = 2 << 30
"""a shape larger than this (parameters, one input set, the output) is built on the meta device only"""
REFERENCE_CHECK_LIMIT_S = 1.0
"""the fp32 forward that takes longer than this on the CPU is not run again in float64 at registration: the float64
run takes 2 to 8 times as long there (on a 2-core machine KernelBench's level-1 transposed 3D convolution took 1.9 s
then 15.8 s, a level-2 one 7.9 s then 36 s, under the 10 s this was, and a suite registers 250 such files)"""
REFERENCE_CHECK_MAX_BYTES = 1 << 30
"""a shape whose inputs and output take more than this is not measured at registration: the fp32 run and its
float64 truth need about three times that in the worker's memory (KernelBench's level 1 inputs reach 8 GiB)"""


def _measure_reference(module: ModuleType, shape: ShapeSpec, dtype: str) -> None:
    """The fp32 reference's error against its float64 truth on one input, on this CPU: a problem the truth-based
    policies cannot judge (a long reduction, an op without float64) is said at registration, not at every test."""
    import torch

    from kernelloop.tools.judge import checking
    from kernelloop.tools.judge.inputs import draw_inputs
    from kernelloop.tools.runner import candidate

    if shape.input_bytes is None or shape.input_bytes + (shape.output_bytes or 0) > REFERENCE_CHECK_MAX_BYTES:
        return  # too large to measure here (or of unknown size): each test measures it on its device
    try:
        torch.manual_seed(0)
        model = module.Model(*shape.init_inputs)
        inputs = draw_inputs(module, shape, getattr(torch, dtype, torch.float32), torch.device("cpu"), 0)
        with torch.no_grad():
            started = time.perf_counter()
            outputs = checking.flatten_outputs(model(*candidate.clone_inputs(inputs))) or []
            seconds = time.perf_counter() - started
            if seconds > REFERENCE_CHECK_LIMIT_S:
                return  # too slow to run again in float64 here: each test measures it on its device
            as64 = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
            truth = checking.flatten_outputs(copy.deepcopy(model).double()(*as64)) or []
    except Exception as exc:
        if _out_of_memory(exc):
            return  # the float64 copies did not fit this worker: not the problem's, each test measures it on its device
        shape.reference_note = (
            f"the float64 truth could not be computed ({type(exc).__name__}: {str(exc)[:200]}): only --policy "
            "kernelbench, which compares against the reference in its own precision, can judge it"
        )
        return
    shape.reference_error = max((checking.relative_max_error(o, t) for o, t in zip(outputs, truth)), default=0.0)


def _out_of_memory(exc: BaseException) -> bool:
    """PyTorch's CPU allocator raises RuntimeError ("DefaultCPUAllocator: can't allocate memory") where Python raises
    MemoryError: a level-2 convolution's float64 run asked for 9.5 GB in a worker capped below that."""
    return isinstance(exc, MemoryError) or (isinstance(exc, RuntimeError) and "allocate memory" in str(exc))


class ProblemOutOfMemory(MemoryError):
    """Exercising a shape needed more memory than the check's worker has: the problem is too large here."""


def _exercise(spec: ProblemSpec) -> None:
    """Build Model for every shape (on the meta device first: a wrong constructor fails there, and it says how
    large the parameters are); for a shape small enough, build it for real and call get_inputs() where the shape
    has no input sizes, and measure the reference's own error on the correctness shapes the CPU runs."""
    import torch

    from kernelloop.tools.problems import import_problem_module

    module = import_problem_module(Path(spec.path))
    for shape in spec.shapes:
        parameter_bytes = _build(module, shape, torch.device("meta"))
        total = (parameter_bytes or 0) + (shape.input_bytes or 0) + (shape.output_bytes or 0)
        if parameter_bytes is not None and total > EXERCISE_MAX_BYTES:
            continue  # sized on the meta device; the service decides where it fits
        try:
            if shape.correctness and "cpu" in shape.backends:
                _measure_reference(module, shape, spec.dtype)
            _build(module, shape, torch.device("cpu"))
            if shape.input_shapes is None:
                inputs = module.get_inputs()
                if not isinstance(inputs, (list, tuple)):
                    raise ValueError(f"get_inputs() must return a list of inputs, got {type(inputs).__name__}")
        except (MemoryError, RuntimeError) as exc:
            if isinstance(exc, RuntimeError) and "memory" not in str(exc).lower():
                raise
            raise ProblemOutOfMemory(
                f"shape {shape.name} ran out of memory while Model and get_inputs() were exercised "
                f"(parameters {(parameter_bytes or 0) / 2**30:.2f} GiB, inputs {(shape.input_bytes or 0) / 2**30:.2f} "
                f"GiB, output {(shape.output_bytes or 0) / 2**30:.2f} GiB as measured on the meta device): {exc}"
            ) from exc


def _build(module: ModuleType, shape: ShapeSpec, device: object) -> int | None:
    """Model for one shape on `device`, and the bytes of its parameters and buffers; None where the meta device
    cannot build it (the real build then says whether it can be built at all)."""
    import torch

    try:
        with torch.device(device):  # type: ignore[call-overload]
            model = module.Model(*shape.init_inputs)
    except MemoryError:
        if str(device) == "meta":
            return None
        raise
    except Exception as exc:
        if str(device) == "meta":
            return None
        raise ValueError(
            f"Model{tuple(shape.init_inputs)} failed for shape {shape.name}: {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(model, torch.nn.Module):
        raise ValueError("Model must be a torch.nn.Module")
    return sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))


def main() -> None:
    capabilities.drop_all()  # an uploaded file is code like a submission: it runs with nothing of the judge's
    code_coverage.import_unmeasured("torch")  # which the problem's file imports; ahead of the job
    channel = os.fdopen(int(sys.argv[1]), "w", buffering=1)
    job = ProblemCheckJob.model_validate_json(sys.stdin.buffer.read())
    sys.stdin.close()
    from kernelloop.tools.problems import load_problem_file

    try:
        spec = load_problem_file(Path(job.path), job.name)
        _exercise(spec)
        reply = ProblemCheckReply(nonce=job.nonce, spec=spec)
    except BaseException as exc:  # SystemExit from the file is a rejection too
        traceback.print_exc()
        plain = exc.__class__.__name__ in ("ProblemError", "ProblemOutOfMemory")
        message = str(exc) if plain else f"{type(exc).__name__}: {exc}"
        reply = ProblemCheckReply(
            nonce=job.nonce,
            error=message.replace(job.path, "problem.py"),
            too_large=isinstance(exc, (ProblemOutOfMemory, MemoryError)),
        )
    channel.write(reply.model_dump_json() + "\n")
    channel.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    code_coverage.save()
    os._exit(0)


if __name__ == "__main__":
    main()
