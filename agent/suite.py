"""A suite from two folders: KernelBench problem files and their solutions, evaluated through the service.

The problems are registered with the service (each checked in its sandbox, a few at a time), the solutions
matched to them by file name, and the whole set submitted as one suite; the service evaluates the solutions
on its lanes (builds in parallel on the CPU lanes, tests and benchmarks on the GPU lanes) and records each as
an attempt. The caller follows the suite until every solution has its verdict.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from kernelloop.agent.service_client import ServiceClient
from kernelloop.agent.service_connection import ServiceFailure
from kernelloop.contract import ProblemCreate, SuiteCreate, SuiteEntriesAdd, SuiteEntryCreate, SuitePublic
from kernelloop.tools.jobs import EvalOptions
from kernelloop.tools.problems import problem_name, problem_sets
from kernelloop.tools.results import Backend

REGISTERING_AT_ONCE = 4
POLL_S = 2.0


class SuiteProblem(BaseModel):
    level: str
    path: Path
    solution: Path | None
    name: str = ""
    note: str = ""
    """set when the problem could not be registered: it is left out of the suite, and this says why"""


class SuiteOutcome(BaseModel):
    suite: SuitePublic | None
    left_out: list[SuiteProblem]
    renamed: dict[str, str] = {}


def plan_suite(problems_dir: Path, solutions_dir: Path) -> list[SuiteProblem]:
    """Every problem under `problems_dir` (one level folder, or a folder of them) with its solution, if any."""
    sets = problem_sets(problems_dir)
    return [
        SuiteProblem(level=level, path=path, solution=find_solution(solutions_dir, level, path))
        for level, paths in sets.items()
        for path in paths
    ]


def find_solution(solutions_dir: Path, level: str, problem: Path) -> Path | None:
    """The solution of one problem: `LEVEL/NAME.py` or `NAME.py` under `solutions_dir` (the problem's own file
    name), or KernelBench's generated `level_L_problem_N_sample_S_kernel.py` (lowest sample first)."""
    for candidate in (solutions_dir / level / problem.name, solutions_dir / problem.name):
        if candidate.is_file():
            return candidate
    number = re.match(r"\d+", problem.stem)
    level_number = re.search(r"\d+", level)
    if number is None or level_number is None:
        return None
    pattern = f"level_{int(level_number.group())}_problem_{int(number.group())}_sample_*_kernel.py"
    samples = [p for folder in (solutions_dir / level, solutions_dir) for p in folder.glob(pattern)]
    return min(samples, key=lambda p: (int(re.findall(r"\d+", p.name)[2]), p.name)) if samples else None


def registered_name(stem: str, level: str | None = None) -> str:
    """The name a problem file registers under: its own (KernelBench's `19_ReLU`), prefixed with its level when
    that name is taken by another file, shortened by the one rule (tools.problems.problem_name) where it does not
    fit."""
    return problem_name(f"{level}_{stem}" if level else stem)


async def register_all(client: ServiceClient, plan: list[SuiteProblem]) -> dict[str, str]:
    """Register every problem of the plan (setting each one's `name`, or its `note` when it cannot be);
    returns the problems that took another name than their file's, file name to registered name."""
    gate = asyncio.Semaphore(REGISTERING_AT_ONCE)
    renamed: dict[str, str] = {}

    async def register(problem: SuiteProblem) -> None:
        source = problem.path.read_text()
        async with gate:
            for name in (registered_name(problem.path.stem), registered_name(problem.path.stem, problem.level)):
                answer = await client.register_problem(
                    ProblemCreate(name=name, source=source, file_name=problem.path.name)
                )
                if not isinstance(answer, ServiceFailure):
                    problem.name = name
                    if name != problem.path.stem:
                        renamed[f"{problem.level}/{problem.path.name}"] = name
                    return
                if answer.status_code != 409:  # not a name taken by another file: another name will not help
                    break
            problem.note = str(answer)

    await asyncio.gather(*(register(p) for p in plan))
    return renamed


async def run_suite(
    client: ServiceClient,
    plan: list[SuiteProblem],
    *,
    name: str | None,
    backend: Backend | None,
    options: EvalOptions | None,
    on_update: Callable[[SuitePublic], None] | None = None,
    timeout_s: float = 24 * 3600.0,
    resume: int | None = None,
) -> SuiteOutcome | ServiceFailure:
    """Register, submit and follow the suite until every solution has its verdict (or `timeout_s` passes:
    then the suite as it stands, still running in the service). With `resume`, the suite of that id goes on: its
    entries are kept (those a stopped service left unfinished are queued again when it starts) and the plan's
    problems it lacks are added."""
    renamed = await register_all(client, plan)
    kept = [p for p in plan if p.name]
    left_out = [p for p in plan if not p.name]
    if not kept and resume is None:
        return SuiteOutcome(suite=None, left_out=left_out, renamed=renamed)
    entries = [
        SuiteEntryCreate(
            problem=p.name,
            level=p.level,
            solution=p.solution.name if p.solution else None,
            code=p.solution.read_text() if p.solution else None,
        )
        for p in kept
    ]
    if resume is None:
        suite = await client.create_suite(SuiteCreate(name=name, backend=backend, options=options, entries=entries))
    else:
        suite = await _resumed(client, resume, entries, options)
    deadline = time.monotonic() + timeout_s
    while not isinstance(suite, ServiceFailure):
        if on_update is not None:
            on_update(suite)
        if suite.status == "finished" or time.monotonic() > deadline:
            return SuiteOutcome(suite=suite, left_out=left_out, renamed=renamed)
        await asyncio.sleep(POLL_S)
        suite = await client.suite(suite.id)
    return suite


async def _resumed(
    client: ServiceClient, suite_id: int, entries: list[SuiteEntryCreate], options: EvalOptions | None
) -> SuitePublic | ServiceFailure:
    """The suite `suite_id` with the entries it lacks added."""
    suite = await client.suite(suite_id)
    if isinstance(suite, ServiceFailure):
        return suite
    have = {e.problem for e in suite.entries}
    missing = [e for e in entries if e.problem not in have]
    if not missing:
        return suite
    return await client.add_suite_entries(suite_id, SuiteEntriesAdd(options=options, entries=missing))
