"""Registering a problem: its file is imported and its Model built only inside the sandbox.

`check_problem` first parses the source here (parsing runs nothing), then has a sandboxed worker
(`kernelloop.tools.judge.problem_worker`) load the file, build Model for every shape and call get_inputs(),
and send the resulting ProblemSpec back. Nothing in the file runs in the service.
"""

from __future__ import annotations

import ast

from kernelloop.server.settings import ServiceSettings
from kernelloop.tools.jobs import ProblemCheckJob, ProblemCheckReply
from kernelloop.tools.problems import ProblemSpec
from kernelloop.tools.sandbox.worker_call import JobFolder, WorkerRequest, call_worker

PROBLEM_WORKER_MODULE = "kernelloop.tools.judge.problem_worker"
REQUIRED_NAMES = ("Model", "get_inputs", "get_init_inputs")


class ProblemRejected(ValueError):
    """The file is not a usable problem; the message says what is wrong and how to fix it."""


class ProblemTooLarge(ProblemRejected):
    """The problem ran out of memory while it was checked: its sizes are in the message."""


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
        raise ProblemRejected(
            f"the file defines no {', '.join(missing)}: a KernelBench problem defines class Model, "
            "get_inputs() and get_init_inputs() at module level"
        )


def check_problem(name: str, source: str, settings: ServiceSettings) -> ProblemSpec:
    """Load and exercise the problem in the sandbox, GPUs hidden; return its spec (path: the checked copy's)."""
    precheck(source)

    def make_job(folder: JobFolder) -> ProblemCheckJob:
        path = folder.path / name / "problem.py"
        path.parent.mkdir()
        path.write_text(source)
        return ProblemCheckJob(path=str(path), name=name, nonce=folder.nonce)

    timeout_s = settings.problem_check_timeout_s
    request = WorkerRequest(PROBLEM_WORKER_MODULE, make_job, ProblemCheckReply, timeout_s, folder_prefix="problem")
    call = call_worker(request, settings.sandbox.model_copy(update={"worker_gpus": ""}))
    if not call.replies:
        report = call.report
        if report.timed_out:
            raise ProblemRejected(
                f"loading the problem and building Model took over {timeout_s:.0f} s: "
                "make get_init_inputs()/get_inputs() cheaper or add SHAPES with smaller sizes"
            )
        tail = " | ".join(report.stderr.strip().splitlines()[-3:])
        raise ProblemRejected(f"the problem check died (exit {report.exit_code}, signal {report.signal}): {tail}")
    reply = call.replies[-1]
    if reply.error is not None and reply.too_large:
        raise ProblemTooLarge(reply.error)
    if reply.error is not None or reply.spec is None:
        raise ProblemRejected(reply.error or "the problem check sent no spec")
    # the check ran the uploaded file, so its reply is the uploader's to forge: only derived data is taken
    # from it (shapes, dtype, tolerance, forbidden operators, all validated), never the name, source or path
    return reply.spec.model_copy(update={"name": name, "source": source, "path": ""})
