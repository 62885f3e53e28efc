"""Registering a problem: its file is imported and its Model built only inside the sandbox.

`check_problem` first parses the source here (parsing runs nothing), then starts a sandboxed worker,
`python -m server.problem_check RESULT_FD`, which loads the file as tools.problems would, builds Model
for every shape and calls get_inputs() where the shapes leave inputs to it, and sends the resulting
ProblemSpec back on the private pipe, tagged with a nonce. Nothing in the file runs in the service.
"""

from __future__ import annotations

import ast
import json
import os
import secrets
import shutil
import sys
import tempfile
import traceback
from pathlib import Path

from pydantic import BaseModel

from kernelloop.tools import sandbox, toolchain
from kernelloop.tools.problems import ProblemSpec
from kernelloop.tools.settings import Settings

REQUIRED_NAMES = ("Model", "get_inputs", "get_init_inputs")


class ProblemRejected(ValueError):
    """The file is not a usable problem; the message says what is wrong and how to fix it."""


class CheckJob(BaseModel):
    path: str
    name: str
    nonce: str


class CheckReply(BaseModel):
    nonce: str
    spec: ProblemSpec | None = None
    error: str | None = None


def _top_level_names(tree: ast.Module) -> tuple[set[str], bool]:
    names: set[str] = set()
    star = False
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                star = star or alias.name == "*"
                names.add((alias.asname or alias.name).split(".")[0])
    return names, star


def precheck(source: str) -> None:
    """What can be said without running the file: it parses and it binds the three names."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise ProblemRejected(f"line {exc.lineno}: {exc.msg}: the problem file must be valid Python") from exc
    names, star = _top_level_names(tree)
    missing = [n for n in REQUIRED_NAMES if n not in names]
    if missing and not star:
        raise ProblemRejected(f"the file defines no {', '.join(missing)}: a KernelBench problem defines class Model, "
                              "get_inputs() and get_init_inputs() at module level")


def check_problem(name: str, source: str, settings: Settings) -> ProblemSpec:
    """Load and exercise the problem in the sandbox; return its spec (path: the checked copy's)."""
    precheck(source)
    settings.jobs_dir.mkdir(parents=True, exist_ok=True)
    job_dir = Path(tempfile.mkdtemp(prefix="problem-", dir=settings.jobs_dir))
    try:
        path = job_dir / name / "problem.py"
        path.parent.mkdir()
        path.write_text(source)
        nonce = secrets.token_hex(16)
        replies: list[CheckReply] = []

        def on_message(line: bytes) -> None:
            try:
                reply = CheckReply.model_validate_json(line)
            except ValueError:
                return
            if reply.nonce == nonce:
                replies.append(reply)

        hidden_gpus = settings.model_copy(update={"worker_gpus": ""})
        env = sandbox.worker_environment(toolchain.build_environment(hidden_gpus), job_dir)
        report = sandbox.run_worker(CheckJob(path=str(path), name=name, nonce=nonce).model_dump_json().encode(),
                                    job_dir=job_dir, writable=[], env=env, timeout_s=settings.problem_check_timeout_s,
                                    settings=settings, on_message=on_message, module="kernelloop.server.problem_check")
    finally:
        shutil.rmtree(job_dir, ignore_errors=True)
    if not replies:
        if report.timed_out:
            raise ProblemRejected(f"loading the problem and building Model took over {settings.problem_check_timeout_s:.0f} s: "
                                  "make get_init_inputs()/get_inputs() cheaper or add SHAPES with smaller sizes")
        tail = " | ".join(report.stderr.strip().splitlines()[-3:])
        raise ProblemRejected(f"the problem check died (exit {report.exit_code}, signal {report.signal}): {tail}")
    reply = replies[-1]
    if reply.error is not None or reply.spec is None:
        raise ProblemRejected(reply.error or "the problem check sent no spec")
    return reply.spec


def _exercise(spec: ProblemSpec) -> None:
    """Build Model for every shape; call get_inputs() where a shape has no input sizes."""
    import torch

    from kernelloop.tools.problems import import_problem_module

    module = import_problem_module(Path(spec.path))
    for shape in spec.shapes:
        try:
            model = module.Model(*shape.init_inputs)
        except Exception as exc:
            raise ValueError(f"Model{tuple(shape.init_inputs)} failed for shape {shape.name}: "
                             f"{type(exc).__name__}: {exc}") from exc
        if not isinstance(model, torch.nn.Module):
            raise ValueError("Model must be a torch.nn.Module")
        if shape.input_shapes is None:
            inputs = module.get_inputs()
            if not isinstance(inputs, (list, tuple)):
                raise ValueError(f"get_inputs() must return a list of inputs, got {type(inputs).__name__}")


def main() -> None:
    channel = os.fdopen(int(sys.argv[1]), "w", buffering=1)
    job = CheckJob.model_validate_json(sys.stdin.buffer.read())
    sys.stdin.close()
    from kernelloop.tools.problems import load_problem_file

    try:
        spec = load_problem_file(Path(job.path), job.name)
        _exercise(spec)
        reply = CheckReply(nonce=job.nonce, spec=spec)
    except BaseException as exc:  # SystemExit from the file is a rejection too
        traceback.print_exc()
        message = str(exc) if exc.__class__.__name__ == "ProblemError" else f"{type(exc).__name__}: {exc}"
        reply = CheckReply(nonce=job.nonce, error=message.replace(job.path, "problem.py"))
    channel.write(json.dumps(reply.model_dump(mode="json")) + "\n")
    channel.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
