"""Entry point of a problem check: `python -m kernelloop.tools.problem_worker RESULT_FD`, the job on stdin.

It loads an uploaded problem file as `kernelloop.tools.problems` would, builds Model for every shape,
calls get_inputs() where the shapes leave the inputs to it, and sends the resulting ProblemSpec (or what
failed) back on the private pipe, tagged with the job's nonce. Nothing in the file runs in the service.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

from kernelloop.tools.jobs import ProblemCheckJob, ProblemCheckReply
from kernelloop.tools.problems import ProblemSpec


def _exercise(spec: ProblemSpec) -> None:
    """Build Model for every shape; call get_inputs() where a shape has no input sizes."""
    import torch

    from kernelloop.tools.problems import import_problem_module

    module = import_problem_module(Path(spec.path))
    for shape in spec.shapes:
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
