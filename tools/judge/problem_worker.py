"""Entry point of a problem check: `python -m kernelloop.tools.judge.problem_worker RESULT_FD`, the job on stdin.

It loads an uploaded problem file as `kernelloop.tools.problems` would, builds Model for every shape,
calls get_inputs() where the shapes leave the inputs to it, and sends the resulting ProblemSpec (or what
failed) back on the private pipe, tagged with the job's nonce. Nothing in the file runs in the service.
"""

from __future__ import annotations

import copy
import os
import sys
import time
import traceback
from pathlib import Path
from types import ModuleType

from kernelloop.tools.jobs import ProblemCheckJob, ProblemCheckReply
from kernelloop.tools.problems import ProblemSpec, ShapeSpec

REFERENCE_CHECK_LIMIT_S = 10.0
"""the fp32 forward that takes longer than this on the CPU is not run again in float64 at registration"""
REFERENCE_CHECK_MAX_BYTES = 1 << 30
"""a shape whose inputs and output take more than this is not measured at registration: the fp32 run and its
float64 truth need about three times that in the worker's memory (KernelBench's level 1 inputs reach 8 GiB)"""


def _measure_reference(module: ModuleType, shape: ShapeSpec, dtype: str) -> None:
    """The fp32 reference's error against its float64 truth on one input, on this CPU: a problem the truth-based
    policies cannot judge (a long reduction, an op without float64) is said at registration, not at every test."""
    import torch

    from kernelloop.tools.judge import checking
    from kernelloop.tools.runner import candidate

    if shape.input_bytes is None or shape.input_bytes + (shape.output_bytes or 0) > REFERENCE_CHECK_MAX_BYTES:
        return  # too large to measure here (or of unknown size): each test measures it on its device
    try:
        torch.manual_seed(0)
        model = module.Model(*shape.init_inputs)
        inputs = candidate.make_inputs(module, shape, getattr(torch, dtype, torch.float32), torch.device("cpu"), 0)
        with torch.no_grad():
            started = time.perf_counter()
            outputs = checking.flatten_outputs(model(*candidate.clone_inputs(inputs))) or []
            seconds = time.perf_counter() - started
            if seconds > REFERENCE_CHECK_LIMIT_S:
                return  # too slow to run again in float64 here: each test measures it on its device
            as64 = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
            truth = checking.flatten_outputs(copy.deepcopy(model).double()(*as64)) or []
    except Exception as exc:
        shape.reference_note = (
            f"the float64 truth could not be computed ({type(exc).__name__}: {str(exc)[:200]}): only --policy "
            "kernelbench, which compares against the reference in its own precision, can judge it"
        )
        return
    shape.reference_error = max((checking.relative_max_error(o, t) for o, t in zip(outputs, truth)), default=0.0)


def _exercise(spec: ProblemSpec) -> None:
    """Build Model for every shape; call get_inputs() where a shape has no input sizes; measure the reference's
    own error on the correctness shapes the CPU runs."""
    import torch

    from kernelloop.tools.problems import import_problem_module

    module = import_problem_module(Path(spec.path))
    for shape in spec.shapes:
        if shape.correctness and "cpu" in shape.backends:
            _measure_reference(module, shape, spec.dtype)
        try:
            model = module.Model(*shape.init_inputs)
        except Exception as exc:
            raise ValueError(
                f"Model{tuple(shape.init_inputs)} failed for shape {shape.name}: {type(exc).__name__}: {exc}"
            ) from exc
        if not isinstance(model, torch.nn.Module):
            raise ValueError("Model must be a torch.nn.Module")
        if shape.input_shapes is None:
            inputs = module.get_inputs()
            if not isinstance(inputs, (list, tuple)):
                raise ValueError(f"get_inputs() must return a list of inputs, got {type(inputs).__name__}")


def main() -> None:
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
        message = str(exc) if exc.__class__.__name__ == "ProblemError" else f"{type(exc).__name__}: {exc}"
        reply = ProblemCheckReply(nonce=job.nonce, error=message.replace(job.path, "problem.py"))
    channel.write(reply.model_dump_json() + "\n")
    channel.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
