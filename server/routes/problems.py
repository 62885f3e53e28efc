"""The problems: list, one with its source and shapes, registration of a KernelBench file, leaderboards."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response
from fastapi.concurrency import run_in_threadpool

from kernelloop.contract import (
    LEADERBOARD_MODE,
    ErrorBody,
    LeaderboardEntry,
    ProblemCreate,
    ProblemDetail,
    ProblemSummary,
)
from kernelloop.server import reads
from kernelloop.server.auth import READ_GUARDED, MutationGuard, ReadGuard
from kernelloop.server.routes.deps import ServiceDep, SessionDep
from kernelloop.tools.results import Backend, Mode

router = APIRouter(prefix="/v1", tags=["problems"], dependencies=[ReadGuard], responses=READ_GUARDED)

ProblemName = Annotated[str, Path(max_length=reads.MAX_NAME_CHARS, description="a problem name, e.g. causal_conv1d")]


@router.get("/problems", response_model=list[ProblemSummary])
def list_problems(session: SessionDep) -> list[ProblemSummary]:
    """Every problem the service knows: the shipped ones and those registered over HTTP."""
    return reads.problem_summaries(session)


@router.get("/problems/{name}", response_model=ProblemDetail, responses={404: {"model": ErrorBody}})
def get_problem(name: ProblemName, service: ServiceDep, session: SessionDep) -> ProblemDetail:
    """One problem: its source, shapes (constructor arguments, input sizes, FLOP and byte counts), tolerance."""
    return reads.problem_detail(service, session, name, "path.name")


@router.post(
    "/problems",
    response_model=ProblemDetail,
    status_code=201,
    responses={
        200: {"model": ProblemDetail, "description": "the same file was already registered"},
        **{code: {"model": ErrorBody} for code in (400, 401, 409, 413, 422, 429, 503)},
    },
)
async def register_problem(
    body: ProblemCreate, service: ServiceDep, _client: MutationGuard, response: Response
) -> ProblemDetail:
    """Register a KernelBench-format file. It is imported, and Model built for each shape, in the sandbox
    before it is kept; nothing in it runs in the service."""
    detail, created = await run_in_threadpool(service.registrar.register, body)
    if not created:
        response.status_code = 200
    return detail


@router.get(
    "/problems/{name}/leaderboard", response_model=list[LeaderboardEntry], responses={404: {"model": ErrorBody}}
)
def problem_leaderboard(
    name: ProblemName,
    service: ServiceDep,
    session: SessionDep,
    backend: Backend | None = None,
    limit: Annotated[int, Query(ge=1, le=reads.MAX_LEADERBOARD)] = 10,
    mode: Annotated[Mode, Query(description=LEADERBOARD_MODE)] = "infer",
) -> list[LeaderboardEntry]:
    """The problem's correct attempts judged in the mode, best first: each place the first made that none after it
    cleared beyond the noise (its speedup interval wholly above), as the search chooses its best
    (tools.speedup_estimate)."""
    return reads.problem_leaderboard(service, session, name, "path.name", backend, limit, mode)
