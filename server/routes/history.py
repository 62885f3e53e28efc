"""The history: runs, attempts with their code and every evaluation, diffs, and the best per problem."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from sqlmodel import Session

from kernelloop.contract import (
    LEADERBOARD_MODE,
    MAX_ID,
    AttemptDetail,
    AttemptDiff,
    AttemptFilter,
    AttemptSummary,
    DuelPublic,
    ErrorBody,
    LeaderboardEntry,
    MeasurementPublic,
    Page,
    RunCreate,
    RunPublic,
    RunStatus,
    RunUpdate,
)
from kernelloop.server import reads
from kernelloop.server.auth import READ_GUARDED, MutationGuard, ReadGuard
from kernelloop.server.duel import duel_of
from kernelloop.server.errors import ApiError, row_or_unknown
from kernelloop.server.provenance import service_provenance
from kernelloop.server.routes.deps import AttemptId, DuelId, RunId, ServiceDep, SessionDep
from kernelloop.storage import duels, history
from kernelloop.storage.models import Run
from kernelloop.tools.results import Backend, Mode

router = APIRouter(prefix="/v1", tags=["history"], dependencies=[ReadGuard], responses=READ_GUARDED)

MUTATION_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (400, 401, 404, 413, 422, 429)
}


def _run(session: Session, run_id: int) -> Run:
    return row_or_unknown(session, Run, run_id, field="path.run_id", fix="GET /v1/runs lists the runs")


@router.post("/runs", response_model=RunPublic, status_code=201, responses=MUTATION_ERRORS)
def create_run(body: RunCreate, service: ServiceDep, session: SessionDep, _client: MutationGuard) -> RunPublic:
    """Start a run: the attempts of one agent session, kept together."""
    problem = service.problem_row(session, body.problem, "body.problem")
    version, commit = service_provenance()
    run = history.create_run(session, problem, body, version=version, source_commit=commit)
    return history.run_public(session, run)


@router.get("/runs", response_model=Page[RunPublic], responses={404: {"model": ErrorBody}, 422: {"model": ErrorBody}})
def list_runs(
    service: ServiceDep,
    session: SessionDep,
    problem: Annotated[str | None, Query(max_length=200)] = None,
    status: RunStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_ID)] = 0,
) -> Page[RunPublic]:
    """Runs, newest first, with their attempt count and best correct speedup."""
    problem_id = service.problem_row(session, problem, "query.problem").id if problem is not None else None
    return history.list_runs(session, problem_id=problem_id, status=status, limit=limit, offset=offset)


@router.get("/runs/{run_id}", response_model=RunPublic, responses={404: {"model": ErrorBody}})
def get_run(run_id: RunId, session: SessionDep) -> RunPublic:
    """One run; its attempts are GET /v1/attempts?run_id=..."""
    return history.run_public(session, _run(session, run_id))


@router.patch("/runs/{run_id}", response_model=RunPublic, responses=MUTATION_ERRORS)
def update_run(run_id: RunId, body: RunUpdate, session: SessionDep, _client: MutationGuard) -> RunPublic:
    """Mark a run finished or interrupted, add notes, merge counters into its meta (tokens, ...)."""
    return history.run_public(session, history.update_run(session, _run(session, run_id), body))


@router.get("/attempts", response_model=Page[AttemptSummary], responses={422: {"model": ErrorBody}})
def list_attempts(session: SessionDep, f: Annotated[AttemptFilter, Query()]) -> Page[AttemptSummary]:
    """Attempts, filtered (problem, run, status, backend, mode, proposer, correct, minimum speedup), sorted, paged."""
    return history.list_attempts(session, f)


@router.get("/attempts/{attempt_id}", response_model=AttemptDetail, responses={404: {"model": ErrorBody}})
def get_attempt(attempt_id: AttemptId, session: SessionDep) -> AttemptDetail:
    """One attempt: its code and every evaluation with the full result and log."""
    return reads.attempt_detail(session, attempt_id, "path.attempt_id")


@router.get(
    "/attempts/{attempt_id}/measurements", response_model=list[MeasurementPublic], responses={404: {"model": ErrorBody}}
)
def attempt_measurements(attempt_id: AttemptId, session: SessionDep) -> list[MeasurementPublic]:
    """Every benchmark of the attempt that timed, oldest first, each as it was taken (when, host, device, the host's
    load, toolchain, per-shape median, spread and n): appended, never replaced. The attempt's speedup is the median
    of the counted ones, with an interval (tools.speedup_estimate)."""
    reads.attempt_row(session, attempt_id, "path.attempt_id")
    return history.measurements(session, attempt_id)


@router.get(
    "/attempts/{attempt_id}/diff",
    response_model=AttemptDiff,
    responses={404: {"model": ErrorBody}, 422: {"model": ErrorBody}},
)
def diff_attempt(
    attempt_id: AttemptId,
    session: SessionDep,
    against: Annotated[int | None, Query(ge=1, le=MAX_ID, description="default: the parent attempt")] = None,
) -> AttemptDiff:
    """Unified diff from another attempt's code (by default its parent's) to this one's."""
    attempt = reads.attempt_row(session, attempt_id, "path.attempt_id")
    base = against if against is not None else attempt.parent_id
    if base is None:
        raise ApiError(
            422,
            "no_parent",
            f"attempt {attempt_id} has no parent to diff against",
            field="query.against",
            fix="give ?against=ATTEMPT_ID",
        )
    reads.attempt_row(session, base, "query.against")
    diff = history.diff_attempts(session, base, attempt_id)
    assert diff is not None  # both attempts exist
    return diff


@router.get("/duels", response_model=list[DuelPublic], responses={404: {"model": ErrorBody}})
def list_duels(
    session: SessionDep,
    run_id: Annotated[int | None, Query(ge=1, le=MAX_ID, description="only the duels of this run's attempts")] = None,
) -> list[DuelPublic]:
    """Duels (two attempts re-timed back to back, POST /v1/attempts/{id}/duel), oldest first: every round and the
    verdict. A confirmed one lets its challenger replace its incumbent in the run's best and the leaderboard."""
    if run_id is None:
        return duels.list_duels(session)
    row_or_unknown(session, Run, run_id, field="query.run_id", fix="GET /v1/runs lists the runs")
    return duels.run_duels(session, run_id)


@router.get("/duels/{duel_id}", response_model=DuelPublic, responses={404: {"model": ErrorBody}})
def get_duel(duel_id: DuelId, service: ServiceDep) -> DuelPublic:
    """One duel: its rounds so far (each side's speedup and job), and its verdict once it has one."""
    return duel_of(service, duel_id)


@router.get("/leaderboard", response_model=list[LeaderboardEntry], responses={422: {"model": ErrorBody}})
def leaderboard(
    session: SessionDep,
    backend: Backend | None = None,
    mode: Annotated[Mode, Query(description=LEADERBOARD_MODE)] = "infer",
) -> list[LeaderboardEntry]:
    """The best correct attempt of every problem judged in the mode: the first made that no later one cleared beyond
    the noise."""
    return history.leaderboard(session, backend=backend, mode=mode)
