"""A suite from two folders: KernelBench problem files and their solutions, evaluated through the service.

The problems are registered with the service (each checked in its sandbox, a few at a time), the solutions
matched to them by file name, and submitted as one suite as they register: the suite is made with the first
and the rest are added as they come; the service evaluates the solutions on its lanes (builds in parallel on
the CPU lanes, tests and benchmarks on the GPU lanes) and records each as an attempt. The caller follows the
suite until every solution has its verdict.
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


async def register_all(
    client: ServiceClient, plan: list[SuiteProblem], on_registered: Callable[[SuiteProblem], None] | None = None
) -> dict[str, str]:
    """Register every problem of the plan (setting each one's `name`, or its `note` when it cannot be), handing
    each to `on_registered` as it ends either way; returns the problems that took another name than their
    file's, file name to registered name."""
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
                    break
                if answer.status_code != 409:  # not a name taken by another file: another name will not help
                    problem.note = str(answer)
                    break
            else:
                problem.note = str(answer)
        if on_registered is not None:
            on_registered(problem)

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
    """Register the plan's problems and judge their solutions as they register, following the suite until every
    solution has its verdict (or `timeout_s` passes: then the suite as it stands, still running in the service).
    The suite is made with the first problems registered and the others are added as they come, so the lanes
    judge while the next problems are checked: registered first, KernelBench's 250 problems held back every
    verdict by minutes. With `resume`, the suite of that id goes on: its entries are kept (those a stopped
    service left unfinished are queued again when it starts) and the plan's problems it lacks are added."""
    suite: SuitePublic | None = None
    if resume is not None:
        resumed = await client.suite(resume)
        if isinstance(resumed, ServiceFailure):
            return resumed
        suite = resumed
    registered: list[SuiteProblem] = []
    registering = asyncio.ensure_future(register_all(client, plan, registered.append))
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            if registered:
                batch = [p for p in registered if p.name]
                registered.clear()
                joined = await _with_entries(client, suite, batch, name, backend, options)
                if isinstance(joined, ServiceFailure):
                    return joined
                suite = joined
            if suite is not None and on_update is not None:
                on_update(suite)
            all_in = registering.done() and not registered
            if all_in:
                registering.result()  # what registering raised, raised here
            if all_in and (suite is None or suite.status == "finished") or time.monotonic() > deadline:
                break
            await asyncio.sleep(POLL_S)
            if suite is not None:
                now = await client.suite(suite.id)
                if isinstance(now, ServiceFailure):
                    return now
                suite = now
    finally:
        registering.cancel()  # the deadline came before every problem was registered
    for problem in plan:
        if not problem.name and not problem.note:
            problem.note = f"not registered within the suite's {timeout_s:.0f} s"
    renamed = {f"{p.level}/{p.path.name}": p.name for p in plan if p.name and p.name != p.path.stem}
    return SuiteOutcome(suite=suite, left_out=[p for p in plan if not p.name], renamed=renamed)


async def _with_entries(
    client: ServiceClient,
    suite: SuitePublic | None,
    problems: list[SuiteProblem],
    name: str | None,
    backend: Backend | None,
    options: EvalOptions | None,
) -> SuitePublic | ServiceFailure | None:
    """The suite with an entry for each of `problems` it lacks: made with them when there is none yet."""
    entries = [
        SuiteEntryCreate(
            problem=p.name,
            level=p.level,
            solution=p.solution.name if p.solution else None,
            code=p.solution.read_text() if p.solution else None,
        )
        for p in problems
    ]
    if suite is None:
        if not entries:
            return None
        return await client.create_suite(SuiteCreate(name=name, backend=backend, options=options, entries=entries))
    have = {e.problem for e in suite.entries}
    missing = [e for e in entries if e.problem not in have]
    if not missing:
        return suite
    return await client.add_suite_entries(suite.id, SuiteEntriesAdd(options=options, entries=missing))
